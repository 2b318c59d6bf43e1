import type { DynamicModule, INestApplication, Type } from '@nestjs/common';
import type { NestExpressApplication } from '@nestjs/platform-express';
import { createHttpApp } from '@app/http';
import { DirectAnswerExpressAdapter } from '@app/idempotency';
import { useJsonBody } from '@app/problem';
import { DocumentBuilder, SwaggerModule } from '@nestjs/swagger';
import { Logger } from 'nestjs-pino';
import { GATEWAY_MAX_BODY_BYTES, GATEWAY_PATH } from './gateway/chat-completions.controller';
import { RESPONSES_PATH } from './gateway/responses.controller';
import { GatewayFastPath } from './gateway/gateway-fast-path';
import { UnknownElementException } from '@nestjs/core/internal';
import { ApiKeyGuard } from './auth/api-key.guard';
import { ADMIN_KEY_AUTH, TENANT_KEY_AUTH } from './openapi';

export const MAX_BODY_BYTES = 1024 * 1024;
/** No request body of ours nests anywhere near this; far deeper ones overflow recursive code (a 500). */
export const MAX_JSON_DEPTH = 32;
/** Members of one object: our DTOs declare a handful; class-transformer's cost per object is quadratic in them. */
export const MAX_JSON_MEMBERS = 1000;
/** Values in one body: far above what a request of ours needs, low enough that no body keeps the event loop busy. */
export const MAX_JSON_VALUES = 20_000;

/**
 * What the HTTP server needs beyond the module graph, shared by main.ts and
 * the end-to-end tests: JSON bodies of at most 1 MiB within structural limits,
 * refused as problem+json once logged and counted; pino as the logger, the
 * OpenAPI document at /docs (the JSON at /docs/openapi.json). main.ts serves
 * it (serveHttpApp: the server's limits, shutdown hooks).
 */
export function configureApiApp(app: NestExpressApplication): NestExpressApplication {
  app.useLogger(app.get(Logger));
  app.disable('x-powered-by');
  const keys = app.get(ApiKeyGuard);
  // Before every other middleware: the gateway's calls are served without Express's router.
  const fast = gatewayFastPathOf(app);
  if (fast) app.use(fast.middleware);
  const bodies = useJsonBody(app, {
    maxBytes: MAX_BODY_BYTES,
    // A model's whole conversation (images as data URLs too) is larger than
    // any job of ours; only a tenant's request gets to send that much.
    largerBodies: [GATEWAY_PATH, RESPONSES_PATH].map((path) => ({
      path: `/${path}`,
      maxBytes: GATEWAY_MAX_BODY_BYTES,
      when: (req: Parameters<typeof keys.tenantOf>[0]) => keys.tenantOf(req, { internalKey: true }) !== undefined,
    })),
    maxDepth: MAX_JSON_DEPTH,
    maxMembers: MAX_JSON_MEMBERS,
    maxValues: MAX_JSON_VALUES,
  });
  fast?.serveFor(app, bodies);
  const document = SwaggerModule.createDocument(
    app,
    new DocumentBuilder()
      .setTitle('LLM workflows API')
      .setDescription(
        "Summarisation jobs behind idempotent POSTs, and an OpenAI-compatible gateway (chat completions and responses) whose retries never bill twice. Errors are application/problem+json (RFC 9457), except on the gateway, which answers in OpenAI's error envelope.",
      )
      .setVersion('1')
      // addSecurity, not addBearerAuth: that one adds `bearerFormat: JWT`, and our keys are opaque strings.
      .addSecurity(TENANT_KEY_AUTH, {
        type: 'http',
        scheme: 'bearer',
        description:
          'An API key from API_KEYS, an opaque string sent as `Authorization: Bearer <key>`; it names the tenant',
      })
      .addSecurity(ADMIN_KEY_AUTH, {
        type: 'http',
        scheme: 'bearer',
        description:
          'ADMIN_API_KEY, an opaque string sent as `Authorization: Bearer <key>`, for the /admin endpoints only; tenant keys get 401',
      })
      .build(),
  );
  SwaggerModule.setup('docs', app, document, { jsonDocumentUrl: 'docs/openapi.json' });
  return app;
}

/** The app's GatewayFastPath; none in an app without the gateway (a bench's side made of the api's parts). */
function gatewayFastPathOf(app: NestExpressApplication): GatewayFastPath | undefined {
  try {
    return app.get(GatewayFastPath);
  } catch (err) {
    if (err instanceof UnknownElementException) return undefined;
    throw err;
  }
}

export async function createApiApp(root: DynamicModule | Type): Promise<INestApplication & NestExpressApplication> {
  return configureApiApp(await createHttpApp(root, new DirectAnswerExpressAdapter()));
}
