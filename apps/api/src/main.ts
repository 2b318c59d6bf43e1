import 'reflect-metadata';
import { ConfigValidationError } from '@app/config';
import { loadApiConfig } from './api.config';
import { ApiModule } from './api.module';
import { createApiApp } from './create-api-app';

async function main(): Promise<void> {
  const config = loadApiConfig();
  const app = await createApiApp(ApiModule.forRoot(config));
  await app.listen(config.port);
}

main().catch((err: unknown) => {
  if (err instanceof ConfigValidationError) {
    process.stderr.write(`api: ${err.message}\n`);
  } else {
    process.stderr.write(`api: failed to start: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  }
  process.exit(1);
});
