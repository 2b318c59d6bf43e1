import 'reflect-metadata';
import { ConfigValidationError } from '@app/config';
import { OperationsService } from '@app/operations';
import { dataSourceOptions } from '@app/persistence';
import { NestFactory } from '@nestjs/core';
import { DataSource } from 'typeorm';
import { loadAdminConfig } from './admin.config';
import { AdminCliModule } from './admin.module';
import { runCommand, USAGE, UsageError } from './commands';
import { StderrJsonLogger } from './stderr.logger';

/**
 * The operators' command line: `npm run admin -- <command>`, or in the image
 * `node dist/apps/admin/main.js <command>` (the migration Job runs `migrate`).
 */
async function main(argv: string[]): Promise<number> {
  if (argv.length === 0 || argv[0] === '--help' || argv[0] === 'help') {
    process.stdout.write(`${USAGE}\n`);
    return argv.length === 0 ? 2 : 0;
  }
  const config = loadAdminConfig();

  if (argv[0] === 'migrate') {
    if (argv.length > 1) throw new UsageError('migrate takes no arguments');
    const ds = new DataSource(dataSourceOptions({ url: config.databaseUrl, applicationName: 'migrations' }));
    await ds.initialize();
    try {
      const applied = await ds.runMigrations({ transaction: 'each' });
      process.stdout.write(`${JSON.stringify({ applied: applied.map((m) => m.name) })}\n`);
    } finally {
      await ds.destroy();
    }
    return 0;
  }

  const app = await NestFactory.createApplicationContext(AdminCliModule.forRoot(config), {
    logger: new StderrJsonLogger(),
  });
  try {
    const { output, exitCode } = await runCommand(app.get(OperationsService), argv);
    process.stdout.write(`${JSON.stringify(output, null, 2)}\n`);
    return exitCode;
  } finally {
    await app.close();
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    if (err instanceof UsageError) {
      process.stderr.write(`admin: ${err.message}\n\n${USAGE}\n`);
      process.exit(2);
    }
    process.stderr.write(
      err instanceof ConfigValidationError
        ? `admin: ${err.message}\n`
        : `admin: ${err instanceof Error ? err.message : String(err)}\n`,
    );
    process.exit(1);
  },
);
