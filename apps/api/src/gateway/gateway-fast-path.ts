import {
  Body,
  ForbiddenException,
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type PipeTransform,
  Req,
  Res,
  type Type,
} from '@nestjs/common';
import { ApplicationConfig, HttpAdapterHost, ModuleRef } from '@nestjs/core';
import { ExecutionContextHost } from '@nestjs/core/helpers/execution-context-host.js';
import { markRejectedByPipes } from '@nestjs/core/router/rejected-by-pipes.js';
import { RouterResponseController } from '@nestjs/core/router/router-response-controller.js';
import { isStreamingBody } from '@nestjs/core/router/streaming-body.js';
import { getIdempotencyContext, IdempotencyContext, IdempotencyInterceptor } from '@app/idempotency';
import { HTTP_ACCESS_LOG, HttpMetricsMiddleware } from '@app/observability';
import { BodyRejectionGuard, type JsonBodyReader, RequestValidationPipe } from '@app/problem';
import { setHttpRoute } from '@app/tracing';
import type { NextFunction, Request, Response } from 'express';
import { PARAMS_PROVIDER_TOKEN, type Params, PinoLogger } from 'nestjs-pino';
import type { HttpLogger } from 'pino-http';
import { Registry } from 'prom-client';
import { defer, from, lastValueFrom } from 'rxjs';
import { ApiKeyGuard } from '../auth/api-key.guard';
import { requireTenant, Tenant } from '../auth/principal';
import { ChatCompletionRequestPipe } from './chat-completion-request.pipe';
import { ChatCompletionsController, GATEWAY_PATH } from './chat-completions.controller';
import { GatewayCallsMiddleware } from './gateway-calls.middleware';
import { type FastPathExpectations, fastPathMismatches } from './gateway-fast-path.check';
import { GatewayMetrics } from './gateway.metrics';
import { OpenAiErrorFilter } from './openai-errors';
import { ResponseRequestPipe } from './response-request.pipe';
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
}

/**
 * The parameters GatewayFastPath gives each route's `create` (see `invoke`),
 * as their decorators: a route whose own differ fails the start.
 */
class Parameters {
  chat(
    @Body(ChatCompletionRequestPipe) _body: unknown,
    @Req() _req: unknown,
    @Tenant() _tenant: string,
    @IdempotencyContext() _idempotency: unknown,
    @Res({ passthrough: true }) _res: unknown,
  ): void {}

  responses(
    @Body(ResponseRequestPipe) _body: unknown,
    @Req() _req: unknown,
    @Tenant() _tenant: string,
    @IdempotencyContext() _idempotency: unknown,
    @Res({ passthrough: true }) _res: unknown,
  ): void {}
}

/** The handlers' `@HttpCode(200)`. */
const OK = 200;
/** What @Body() tells the pipes of the gateway's body parameters (an interface: no DTO to validate). */
const BODY_PARAM = { type: 'body', metatype: Object, data: undefined } as const;
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

/**
 * The gateway's calls (`POST /v1/chat/completions`, `POST /v1/responses`)
 * served without Express's router and Nest's route pipeline, which cost
 * those calls a fifth of their CPU (docs/benchmarks.md). It runs, in
 * Express's and Nest's order, the very parts they would run for the route:
 * the JSON body parsers and their refusal, the access log (its line and the
 * logger's request context), the HTTP metrics, the gateway's own middleware,
 * the body-rejection and API-key guards, the idempotency interceptor, the
 * pipes, the controller's handler, Nest's sending of what it returns, and the
 * route's OpenAI error filter. Any other request, and any other spelling of
 * these paths (a trailing slash, another case), goes on to Express as before.
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
  private readonly pino: PinoLogger;
  private bodies?: JsonBodyReader;
  // Set once Nest has made them (onApplicationBootstrap), before the first request.
  private keys!: ApiKeyGuard;
  private idempotency!: IdempotencyInterceptor;
  private responses!: RouterResponseController;

  constructor(
    private readonly moduleRef: ModuleRef,
    private readonly adapterHost: HttpAdapterHost,
    private readonly appConfig: ApplicationConfig,
    @Inject(HTTP_ACCESS_LOG) private readonly accessLog: HttpLogger,
    @Inject(PARAMS_PROVIDER_TOKEN) loggerParams: Params,
    registry: Registry,
    gatewayMetrics: GatewayMetrics,
  ) {
    this.metrics = new HttpMetricsMiddleware(registry);
    this.calls = new GatewayCallsMiddleware(gatewayMetrics);
    // The logger's request context, as nestjs-pino's middleware makes it (PinoLogger itself is transient).
    this.pino = new PinoLogger(loggerParams);
  }

  /** The app's JSON body parsers (useJsonBody's), run here as Express would run them for these paths. */
  readBodiesWith(bodies: JsonBodyReader): void {
    this.bodies = bodies;
  }

  /** Once Nest has registered its routes: the two routes, as Express would dispatch them. */
  onApplicationBootstrap(): void {
    const app = this.adapterHost.httpAdapter.getInstance<{ router?: { stack: RouterLayer[] } }>();
    const expressRoute = (path: string): object => {
      const route = app.router?.stack.find((l) => l.route?.path === path && l.route.methods?.post === true)?.route;
      if (!route) throw new Error(`GatewayFastPath: Express has no POST ${path} route to serve`);
      return route;
    };
    const get = <T>(type: Type<T>): T => this.moduleRef.get(type, { strict: false });
    const route = (
      path: string,
      controller: Type,
      pipe: PipeTransform,
      parameters: keyof Parameters,
    ): FastRoute | undefined => {
      const mismatches = fastPathMismatches(
        controller,
        { ...SERVED_AS, parameters: { owner: Parameters, method: parameters } },
        this.appConfig,
      );
      if (mismatches.length > 0) {
        // Served as it is declared, by Express and Nest, rather than without what it was given.
        this.logger.warn(
          `POST ${path} goes through Express's router: ${controller.name}.create or the app has other parts than ` +
            `GatewayFastPath runs (${mismatches.join('; ')})`,
        );
        return undefined;
      }
      return {
        path,
        controller,
        handler: (controller.prototype as { create: (...args: never[]) => unknown }).create,
        instance: get(controller) as FastRoute['instance'],
        pipe,
        expressRoute: expressRoute(path),
      };
    };
    for (const fast of [
      route(`/${GATEWAY_PATH}`, ChatCompletionsController, new ChatCompletionRequestPipe(), 'chat'),
      route(`/${RESPONSES_PATH}`, ResponsesController, new ResponseRequestPipe(), 'responses'),
    ])
      if (fast) this.routes.set(fast.path, fast);
    this.keys = get(ApiKeyGuard);
    this.idempotency = get(IdempotencyInterceptor);
    this.responses = new RouterResponseController(this.adapterHost.httpAdapter);
  }

  /** Express middleware, mounted before every other: serves the two routes, passes anything else on. */
  readonly middleware = (req: Request, res: Response, next: NextFunction): void => {
    if (req.method !== 'POST' || this.bodies === undefined) return next();
    const query = req.url.indexOf('?');
    const route = this.routes.get(query < 0 ? req.url : req.url.slice(0, query));
    if (route === undefined) return next();
    this.serve(route, req, res).catch((err: unknown) => {
      // Every error of the call is its filter's to answer; one here is a fault of this class. The body is read,
      // so Express's route cannot run it again: the connection is closed, as Nest closes one it cannot answer.
      this.logger.error(err instanceof Error ? err : String(err));
      res.destroy();
    });
  };

  private async serve(route: FastRoute, req: Request, res: Response): Promise<void> {
    // Express's order: the body parsers are mounted before Nest's middleware.
    await this.bodies!.read(req, res, route.path);
    this.accessLog(req, res);
    await this.pino.runInContext(() => this.run(route, req, res), { bindings: { req } });
  }

  private async run(route: FastRoute, req: Request, res: Response): Promise<void> {
    this.metrics.use(req, res, noop);
    (req as { route?: object }).route = route.expressRoute;
    setHttpRoute(route.path);
    this.calls.use(req, res, noop);
    const context = new ExecutionContextHost([req, res, noop], route.controller, route.handler);
    try {
      // Global guards first, then the controller's (Nest's order).
      this.bodyGuard.canActivate(context);
      if (!this.keys.canActivate(context)) throw new ForbiddenException();
      res.status(OK);
      const handle = () => defer(() => from(this.invoke(route, req, res)));
      const result = await lastValueFrom(await this.idempotency.intercept(context, { handle }), {
        defaultValue: undefined,
      });
      await (isStreamingBody(result)
        ? this.responses.stream(result, res, req, { statusCode: OK })
        : this.responses.apply(result, res, OK));
    } catch (err) {
      this.filter.catch(err, context);
    }
  }

  /** The handler with its parameters, as Nest's pipes and parameter decorators give them. */
  private async invoke(route: FastRoute, req: Request, res: Response): Promise<unknown> {
    let body: unknown;
    try {
      body = await route.pipe.transform(await this.validation.transform(req.body, BODY_PARAM), BODY_PARAM);
    } catch (err) {
      markRejectedByPipes(req);
      throw err;
    }
    return route.instance.create(body, req, requireTenant(req), getIdempotencyContext(req), res);
  }
}

interface RouterLayer {
  readonly route?: { readonly path: string; readonly methods?: Record<string, boolean> };
}
