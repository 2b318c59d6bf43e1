import {
  Body,
  ForbiddenException,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type PipeTransform,
  RequestMethod,
  Req,
  Res,
  type Type,
} from '@nestjs/common';
import { ApplicationConfig, HttpAdapterHost, ModuleRef } from '@nestjs/core';
import { ExecutionContextHost } from '@nestjs/core/helpers/execution-context-host.js';
import { FORBIDDEN_MESSAGE } from '@nestjs/core/internal';
import { markRejectedByPipes } from '@nestjs/core/router/rejected-by-pipes.js';
import { RouterResponseController } from '@nestjs/core/router/router-response-controller.js';
import { isStreamingBody } from '@nestjs/core/router/streaming-body.js';
import {
  getIdempotencyContext,
  IdempotencyContext,
  onceClosed,
  IdempotencyInterceptor,
  type IdempotencyRequestContext,
} from '@app/idempotency';
import { HttpMetricsMiddleware } from '@app/observability';
import { BodyRejectionGuard, type JsonBodyReader, RequestValidationPipe } from '@app/problem';
import type { CanActivate } from '@nestjs/common';
import { inSpan, setHttpRoute } from '@app/tracing';
import type { NextFunction, Request, Response as ExpressResponse } from 'express';
import { Registry } from 'prom-client';
import { defer, from, isObservable, lastValueFrom, type Observable } from 'rxjs';
import { ApiKeyGuard } from '../auth/api-key.guard';
import { requireTenant, Tenant } from '../auth/principal';
import { type ChatCompletionRequest, ChatCompletionRequestPipe } from './chat-completion-request.pipe';
import { ChatCompletionsController, GATEWAY_PATH } from './chat-completions.controller';
import { GatewayCallsMiddleware } from './gateway-calls.middleware';
import { type FastPathExpectations, fastPathMismatches } from './gateway-fast-path.check';
import { GatewayMetrics } from './gateway.metrics';
import { OpenAiErrorFilter, toOpenAiError } from './openai-errors';
import { type ResponseRequest, ResponseRequestPipe } from './response-request.pipe';
import { RESPONSES_PATH, ResponsesController } from './responses.controller';

/** A gateway call's route: its controller's `create`, and what Nest would run around it. */
interface FastRoute {
  readonly path: string;
  readonly controller: Type;
  readonly handler: (...args: never[]) => unknown;
  readonly instance: { create(...args: unknown[]): Promise<unknown> };
  readonly pipe: PipeTransform;
  /** Express's route for the path: `req.route` as Express would set it (the metrics' route label reads it). */
  readonly expressRoute: object;
  /** Its request-handler span's name and attributes. */
  readonly span: { readonly name: string; readonly attributes: Readonly<Record<string, string>> };
}

/**
 * The parameters GatewayFastPath gives each route's `create` (see `invoke`), as their decorators: a route whose
 * own differ is left to Express and Nest.
 */
class FastPathParameters {
  // The types as the controllers declare them: a build that emits their metadata without type information (webpack's)
  // gives the same classes for both.
  chat(
    @Body(ChatCompletionRequestPipe) _body: ChatCompletionRequest,
    @Req() _req: Request,
    @Tenant() _tenant: string,
    @IdempotencyContext() _idempotency: IdempotencyRequestContext | undefined,
    @Res({ passthrough: true }) _res: ExpressResponse,
  ): void {}

  responses(
    @Body(ResponseRequestPipe) _body: ResponseRequest,
    @Req() _req: Request,
    @Tenant() _tenant: string,
    @IdempotencyContext() _idempotency: IdempotencyRequestContext | undefined,
    @Res({ passthrough: true }) _res: ExpressResponse,
  ): void {}
}

/** The handlers' `@HttpCode(200)`. */
const OK = 200;
/** What @Body() tells the pipes of the gateway's body parameters (an interface: no DTO to validate). */
const BODY_PARAM = { type: 'body', metatype: Object, data: undefined } as const;
/** What the custom parameter decorators tell the global pipes: the tenant's type, and the idempotency context's. */
const TENANT_PARAM = { type: 'custom', metatype: String, data: undefined } as const;
const IDEMPOTENCY_PARAM = { type: 'custom', metatype: Object, data: undefined } as const;
const noop = (): void => undefined;

/** What `run` does in place of Nest's enhancers, in Nest's order. */
const SERVED_AS: Omit<FastPathExpectations, 'parameters'> = {
  guards: [ApiKeyGuard],
  filters: [OpenAiErrorFilter],
  status: OK,
  globalGuards: [BodyRejectionGuard],
  globalInterceptors: [IdempotencyInterceptor],
  globalPipes: [RequestValidationPipe],
};

/** Nest's middleware the fast path runs: these two classes, and nestjs-pino's two (the access log, its context). */
const NEST_MIDDLEWARE = new Set<unknown>([HttpMetricsMiddleware, GatewayCallsMiddleware]);
const NESTJS_PINO_MIDDLEWARE = 2;
/** LoggerModule's routes for its middleware (nestjs-pino's DEFAULT_ROUTES), as compared below. */
const NESTJS_PINO_ROUTES = `${RequestMethod.ALL} {/*splat}`;

/** A guard's answer as Nest's GuardsConsumer reads it: a boolean, or a promise or observable of one. */
async function allowed(answer: boolean | Promise<boolean> | Observable<boolean>): Promise<boolean> {
  const value = await answer;
  return isObservable(value) ? lastValueFrom(value) : value;
}

/**
 * The gateway's calls (`POST /v1/chat/completions`, `POST /v1/responses`)
 * served without Express's router and Nest's route pipeline, which took an
 * eighth to a quarter of those calls' CPU (docs/benchmarks.md). It runs, in
 * Express's and Nest's order, the very parts they would run for the route:
 * the JSON body parsers and their refusal, the access log (its line and the
 * logger's request context), the HTTP metrics, the gateway's own middleware,
 * the body-rejection and API-key guards, the idempotency interceptor, the
 * pipes, the controller's handler, Nest's sending of what it returns, and the
 * route's OpenAI error filter; for tracing, the route's name on the server
 * span and a request-handler span like Express's instrumentation's (named
 * with the route, which Express 5's is not).
 * Any other request, any other spelling of these paths (a trailing slash,
 * another case), and a route whose parts differ from these (checked at start,
 * with a warning) go on to Express as before.
 */
@Injectable()
export class GatewayFastPath implements OnApplicationBootstrap {
  private readonly logger = new Logger(GatewayFastPath.name);
  private readonly routes = new Map<string, FastRoute>();
  private readonly bodyGuard = new BodyRejectionGuard();
  private readonly validation = new RequestValidationPipe();
  private readonly filter = new OpenAiErrorFilter();
  private readonly metrics: HttpMetricsMiddleware;
  private readonly calls: GatewayCallsMiddleware;
  /** nestjs-pino's two middleware as Nest made them: pino-http's access log, then the logger's request context. */
  private requestLogging?: readonly [NestMiddlewareUse, NestMiddlewareUse];
  private app?: object;
  private bodies?: JsonBodyReader;
  // Set once Nest has made them (onApplicationBootstrap), before the first request.
  /** Nest's order: the global guard, then the controllers' (ApiKeyGuard). */
  private guards: readonly CanActivate[] = [];
  private idempotency!: IdempotencyInterceptor;
  private responses!: RouterResponseController;

  constructor(
    private readonly moduleRef: ModuleRef,
    private readonly adapterHost: HttpAdapterHost,
    private readonly appConfig: ApplicationConfig,
    registry: Registry,
    gatewayMetrics: GatewayMetrics,
  ) {
    this.metrics = new HttpMetricsMiddleware(registry);
    this.calls = new GatewayCallsMiddleware(gatewayMetrics);
  }

  /**
   * The app (its Nest middleware is checked against what runs here) and its JSON body parsers (useJsonBody's, run
   * here as Express would run them for these paths). Without this call, nothing is served here.
   */
  serveFor(app: object, bodies: JsonBodyReader): void {
    this.app = app;
    this.bodies = bodies;
  }

  /** Once Nest has registered its routes and middleware: the routes to serve, those whose parts are these. */
  onApplicationBootstrap(): void {
    if (this.bodies === undefined) {
      this.logger.warn("the gateway's routes go through Express's router: GatewayFastPath.serveFor was not called");
      return;
    }
    const stack = this.adapterHost.httpAdapter.getInstance<{ router?: { stack: RouterLayer[] } }>().router?.stack ?? [];
    const served: readonly (readonly [string, Type, PipeTransform, keyof FastPathParameters])[] = [
      [`/${GATEWAY_PATH}`, ChatCompletionsController, new ChatCompletionRequestPipe(), 'chat'],
      [`/${RESPONSES_PATH}`, ResponsesController, new ResponseRequestPipe(), 'responses'],
    ];
    for (const [path, controller, pipe, parameters] of served) {
      try {
        const mismatches = [
          ...fastPathMismatches(
            controller,
            { ...SERVED_AS, parameters: { owner: FastPathParameters, method: parameters } },
            this.appConfig,
          ),
          ...this.middlewareMismatches(stack, path),
        ];
        const expressRoute = stack.find(
          (l) => l.route?.path === path && l.route.methods?.post && !isNestMiddleware(l),
        )?.route;
        if (!expressRoute) mismatches.push(`Express has no POST ${path} route`);
        if (this.appConfig.getGlobalPrefix()) mismatches.push('a global prefix');
        if (this.appConfig.getVersioning()) mismatches.push('versioning');
        if (mismatches.length > 0) throw new Error(mismatches.join('; '));
        const get = <T>(type: Type<T>): T => this.moduleRef.get(type, { strict: false });
        this.guards = [this.bodyGuard, get(ApiKeyGuard)];
        this.idempotency = get(IdempotencyInterceptor);
        this.routes.set(path, {
          path,
          controller,
          handler: (controller.prototype as { create: (...args: never[]) => unknown }).create,
          instance: get(controller) as FastRoute['instance'],
          pipe,
          expressRoute: expressRoute!,
          span: {
            name: `request handler - ${path}`,
            attributes: { 'http.route': path, 'express.name': path, 'express.type': 'request_handler' },
          },
        });
      } catch (err) {
        // Served as it is declared, by Express and Nest, rather than without a part it was given.
        this.logger.warn(
          `POST ${path} goes through Express's router: it or the app has other parts than GatewayFastPath runs ` +
            `(${err instanceof Error ? err.message : String(err)})`,
        );
      }
    }
    this.responses = new RouterResponseController(this.adapterHost.httpAdapter);
  }

  /**
   * What else Express or Nest would run for POST `path`: the layers of Express's router that match it, from the
   * fast path's to the route's, must be the body parsers and Nest's middleware, and Nest's middleware must be the
   * classes run here (configured for the gateway's two routes, in GatewayCallsMiddleware's case).
   */
  private middlewareMismatches(stack: readonly RouterLayer[], path: string): string[] {
    const found: string[] = [];
    const at = stack.findIndex((layer) => unwrapped(layer.handle) === this.middleware);
    if (at < 0) return ['GatewayFastPath.middleware is not mounted on Express'];
    for (const layer of stack.slice(at + 1)) {
      if (!layer.match(path)) continue;
      if (layer.route) {
        if (!layer.route.methods?.post && !layer.route.methods?._all) continue;
        // Nest mounts a middleware bound to a controller's route as a route of its own, on the same path.
        if (isNestMiddleware(layer)) continue;
        if (layer.route.path === path) break;
        found.push(`another route for POST ${layer.route.path}`);
      } else {
        const handle = unwrapped(layer.handle);
        if (this.bodies!.mounted.has(handle) || handle.name === NEST_MIDDLEWARE_LAYER) continue;
        found.push(`middleware ${handle.name || '(anonymous)'} on Express`);
      }
    }
    const container = (this.app as { middlewareContainer?: NestMiddlewareContainer } | undefined)?.middlewareContainer;
    if (typeof container?.getConfigurations !== 'function') return [...found, "the app's Nest middleware is unknown"];
    let pino = 0;
    for (const [moduleKey, configurations] of container.getConfigurations()) {
      for (const { middleware, forRoutes } of configurations) {
        const routes = forRoutes
          .map((r) =>
            typeof r === 'object' && r !== null
              ? `${String(r.method)} ${String(r.path).replace(/\/$/, '')}`
              : String(r),
          )
          .sort();
        if (!middleware.some((type) => NEST_MIDDLEWARE.has(type))) {
          // nestjs-pino's: its middleware and its context's, for every route, as LoggerModule configures them.
          if (middleware.length === NESTJS_PINO_MIDDLEWARE && routes.join() === NESTJS_PINO_ROUTES) {
            pino++;
            this.requestLogging ??= nestjsPinoMiddleware(container, moduleKey, middleware);
            if (!this.requestLogging) found.push("nestjs-pino's middleware instances are unknown");
          } else found.push(`Nest middleware ${middleware.map((m) => (m as { name?: string }).name).join(', ')}`);
          continue;
        }
        if (middleware.length !== 1) found.push('Nest middleware applied beside ours');
        if (!middleware.includes(GatewayCallsMiddleware)) continue;
        const want = [`/${GATEWAY_PATH}`, `/${RESPONSES_PATH}`].map((p) => `${RequestMethod.POST} ${p}`);
        if (routes.join() !== want.join())
          found.push(`GatewayCallsMiddleware for ${routes.join(', ')}, not ${want.join(', ')}`);
      }
    }
    if (pino !== 1) found.push(`${pino} configurations of nestjs-pino's middleware, not one`);
    return found;
  }

  /** Express middleware, mounted before every other: serves the two routes, passes anything else on. */
  readonly middleware = (req: Request, res: ExpressResponse, next: NextFunction): void => {
    if (req.method !== 'POST') return next();
    const query = req.url.indexOf('?');
    const route = this.routes.get(query < 0 ? req.url : req.url.slice(0, query));
    if (route === undefined) return next();
    this.serve(route, req, res).catch((err: unknown) => this.failed(err, res));
  };

  private async serve(route: FastRoute, req: Request, res: ExpressResponse): Promise<void> {
    // Express's order: the body parsers are mounted before Nest's middleware.
    await this.bodies!.read(req, res, route.path);
    // Nest's next middleware: nestjs-pino's pair, which call on at once, the rest of the request in the context.
    const [accessLog, context] = this.requestLogging!;
    let served: Promise<void> | undefined;
    let late = false;
    accessLog(req, res, () =>
      context(req, res, () => {
        // A call on after the 500 below would run the handler for an answered request.
        if (!late) served = this.run(route, req, res);
      }),
    );
    late = true;
    if (served === undefined) throw new Error("nestjs-pino's middleware did not call on at once");
    await served;
  }

  private async run(route: FastRoute, req: Request, res: ExpressResponse): Promise<void> {
    this.metrics.use(req, res, noop);
    (req as { route?: object }).route = route.expressRoute;
    setHttpRoute(route.path);
    this.calls.use(req, res, noop);
    await inSpan(route.span.name, route.span, async (span) => {
      await this.handle(route, req, res);
      // As Express's instrumentation ends it: when the answer is over (a stream's is sent after handle resolves).
      if (span) await new Promise<void>((done) => onceClosed(res, done));
    });
  }

  /** What Nest's router does for the route: guards, interceptors, pipes, the handler, the answer, the filter. */
  private async handle(route: FastRoute, req: Request, res: ExpressResponse): Promise<void> {
    const context = new ExecutionContextHost([req, res, noop], route.controller, route.handler);
    try {
      for (const guard of this.guards) {
        const answer = guard.canActivate(context);
        // A guard's boolean is its answer; Nest awaits it all the same, which changes nothing but the CPU it takes.
        if (!(typeof answer === 'boolean' ? answer : await allowed(answer)))
          throw new ForbiddenException(FORBIDDEN_MESSAGE);
      }
      res.status(OK);
      const handle = () => defer(() => from(this.invoke(route, req, res)));
      // An interceptor that emits nothing is an EmptyError here, as in Nest: the filter's to answer.
      const result = await lastValueFrom(await this.idempotency.intercept(context, { handle }));
      // No status of its own, as Nest sends it: what the handler or an interceptor set on the response stands.
      await (isStreamingBody(result)
        ? this.responses.stream(result, res, req)
        : this.responses.apply(result, res, undefined));
    } catch (err) {
      this.filter.catch(err, context);
    }
  }

  /** The handler with its parameters, as Nest's parameter decorators and pipes give them. */
  private async invoke(route: FastRoute, req: Request, res: ExpressResponse): Promise<unknown> {
    let args: unknown[];
    try {
      const body: unknown = await route.pipe.transform(
        await this.validation.transform(req.body, BODY_PARAM),
        BODY_PARAM,
      );
      const tenant: unknown = await this.validation.transform(requireTenant(req), TENANT_PARAM);
      const idempotency: unknown = await this.validation.transform(getIdempotencyContext(req), IDEMPOTENCY_PARAM);
      args = [body, req, tenant, idempotency, res];
    } catch (err) {
      markRejectedByPipes(req);
      throw err;
    }
    return route.instance.create(...args);
  }

  /**
   * A fault of this class, not of the call (whose every error is its filter's to answer): the body is read, so
   * Express's route cannot run the call again. A 500 in the envelope if nothing was sent yet, else the connection
   * closed, as a cut answer must not look whole.
   */
  private failed(err: unknown, res: ExpressResponse): void {
    this.logger.error(err instanceof Error ? err : String(err));
    if (res.headersSent) {
      res.destroy();
      return;
    }
    try {
      // The envelope of an error that is no HttpException: a 500.
      const { status, body } = toOpenAiError(err);
      res.statusCode = status;
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify(body));
    } catch {
      res.destroy();
    }
  }
}

/** A layer's own handler, under the wrapper OpenTelemetry's Express instrumentation puts around it (shimmer's). */
function unwrapped(handle: LayerHandle): LayerHandle {
  return handle.__original ?? handle;
}

/** A route Nest mounted for a middleware bound to a controller's route (every handler of it Nest's middleware's). */
function isNestMiddleware(layer: RouterLayer): boolean {
  return layer.route?.stack?.every((s) => unwrapped(s.handle).name === NEST_MIDDLEWARE_LAYER) ?? false;
}

/** Nest's name for the Express handler of its middleware (middleware-module.js). */
const NEST_MIDDLEWARE_LAYER = 'handler';

interface LayerHandle {
  readonly name: string;
  readonly __original?: LayerHandle;
}

interface RouterLayer {
  readonly handle: LayerHandle;
  match(path: string): unknown;
  readonly route?: {
    readonly path: string;
    readonly methods?: Record<string, boolean>;
    readonly stack?: readonly { readonly handle: LayerHandle }[];
  };
}

type NestMiddlewareUse = (req: Request, res: ExpressResponse, next: () => void) => void;

/** The `use` of each of nestjs-pino's middleware as Nest instantiated them for `moduleKey`, or undefined. */
function nestjsPinoMiddleware(
  container: NestMiddlewareContainer,
  moduleKey: string,
  middleware: readonly unknown[],
): readonly [NestMiddlewareUse, NestMiddlewareUse] | undefined {
  // As Nest binds them: one instance for every request (not request-scoped or transient).
  const instances = middleware.map((type) => {
    const wrapper = container.getMiddlewareCollection?.(moduleKey)?.get(type);
    const shared = wrapper?.isDependencyTreeStatic?.() === true && wrapper.isTransient !== true;
    return shared ? (wrapper.instance as { use?: NestMiddlewareUse } | undefined) : undefined;
  });
  const uses = instances.map((instance) => instance?.use?.bind(instance));
  const [accessLog, context] = uses;
  return uses.length === 2 && accessLog && context ? [accessLog, context] : undefined;
}

interface NestMiddlewareContainer {
  getMiddlewareCollection?(
    moduleKey: string,
  ):
    | Map<unknown, { readonly instance?: unknown; readonly isTransient?: boolean; isDependencyTreeStatic?(): boolean }>
    | undefined;
  getConfigurations(): Map<
    string,
    Set<{
      readonly middleware: readonly unknown[];
      readonly forRoutes: readonly ({ readonly path?: unknown; readonly method?: unknown } | string | null)[];
    }>
  >;
}
