import { createRequire } from 'node:module';

/*
 * The two @nestjs/swagger decorators @Idempotent() documents a route with,
 * built as @nestjs/swagger in the package (scripts/pack.mjs): an app that
 * has @nestjs/swagger gets the Idempotency-Key header and the 400/409/422/503
 * answers in its OpenAPI document; an app without it gets no documentation
 * and no error. @nestjs/swagger is an optional peer.
 */

type Decorator = MethodDecorator & ClassDecorator;

export interface ApiHeaderOptions {
  readonly name: string;
  readonly required?: boolean;
  readonly description?: string;
  readonly schema?: Record<string, unknown>;
}

export interface ApiResponseOptions {
  readonly status: number;
  readonly description?: string;
  readonly headers?: Record<string, unknown>;
  readonly content?: Record<string, unknown>;
}

interface Swagger {
  ApiHeader(options: ApiHeaderOptions): Decorator;
  ApiResponse(options: ApiResponseOptions): Decorator;
}

function loadSwagger(): Swagger | undefined {
  try {
    // Resolved from the package's folder, so the app's own copy (one metadata registry with its SwaggerModule).
    return createRequire(__filename)('@nestjs/swagger') as Swagger;
  } catch (error) {
    const code = (error as { code?: unknown }).code;
    if (code === 'MODULE_NOT_FOUND' || code === 'ERR_MODULE_NOT_FOUND') return undefined;
    throw error;
  }
}

const swagger = loadSwagger();
const nothing: Decorator = () => undefined;

export function ApiHeader(options: ApiHeaderOptions): Decorator {
  return swagger ? swagger.ApiHeader(options) : nothing;
}

export function ApiResponse(options: ApiResponseOptions): Decorator {
  return swagger ? swagger.ApiResponse(options) : nothing;
}
