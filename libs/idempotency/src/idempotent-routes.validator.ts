import { Inject, Injectable, OnModuleInit } from '@nestjs/common';
import { PATH_METADATA, ROUTE_ARGS_METADATA } from '@nestjs/common/constants';
import { RouteParamtypes } from '@nestjs/common/enums/route-paramtypes.enum';
import { DiscoveryService, HttpAdapterHost, MetadataScanner, ModuleRef, Reflector } from '@nestjs/core';
import { ContextUtils } from '@nestjs/core/internal';
import { RouterResponseController } from '@nestjs/core/router/router-response-controller';
import { sendsDirectAnswers } from './direct-answer';
import { assertValidIdempotentOptions, IdempotentMetadata, type IdempotentOptions } from './idempotent.decorator';
import { IDEMPOTENCY_MODULE_OPTIONS, type IdempotencyModuleOptions } from './idempotency.module-definition';

/**
 * Refuses, at start-up, @Idempotent() routes the interceptor cannot protect,
 * naming each controller method:
 * - a handler that takes @Res() or @Next() without `passthrough` sends its
 *   answer itself. Nothing could be stored, and Nest never sends the value an
 *   interceptor returns for such a handler, so a replay would hang;
 * - options that are not positive whole numbers (e.g. set through
 *   IdempotentMetadata directly, which skips the decorator's own check).
 */
@Injectable()
export class IdempotentRoutesValidator implements OnModuleInit {
  // Nest's own reading of parameter metadata, so "handles the response
  // itself" means exactly what it means to Nest's router.
  private readonly contextUtils = new ContextUtils();

  constructor(
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
    private readonly reflector: Reflector,
    @Inject(IDEMPOTENCY_MODULE_OPTIONS) private readonly options: IdempotencyModuleOptions,
    private readonly moduleRef: ModuleRef,
    private readonly adapterHost: HttpAdapterHost,
  ) {}

  onModuleInit(): void {
    const problems: string[] = [];
    let routes = 0;
    for (const wrapper of this.discovery.getControllers()) {
      const type = wrapper.metatype;
      if (typeof type !== 'function') continue;
      const instance = (wrapper.instance as object | undefined) ?? (Object.create(type.prototype as object) as object);
      const prototype = Object.getPrototypeOf(instance) as Record<string, unknown>;
      for (const name of this.scanner.getAllMethodNames(prototype)) {
        const handler = prototype[name];
        if (typeof handler !== 'function' || !Reflect.hasMetadata(PATH_METADATA, handler)) continue;
        const options = this.reflector.getAllAndOverride<IdempotentOptions | undefined>(IdempotentMetadata, [
          handler,
          type,
        ]);
        if (options === undefined) continue;
        routes++;
        const where = `@Idempotent() on ${type.name}.${name}`;
        try {
          assertValidIdempotentOptions(options, where);
        } catch (err) {
          problems.push((err as Error).message);
        }
        const stores = this.options.stores ?? {};
        if (options.store !== undefined && !Object.hasOwn(stores, options.store)) {
          const known = Object.keys(stores);
          problems.push(
            `${where}: no store named "${options.store}" (IdempotencyModule's stores: ${known.length ? known.join(', ') : 'none'})`,
          );
        }
        if (options.recover !== undefined) problems.push(...this.recoveryProblems(options, where));
        if (this.handlesResponseItself(instance, name)) {
          problems.push(
            `${where}: the handler takes @Res() or @Next() without { passthrough: true }, so it sends its answer itself ` +
              'and the answer can be neither stored nor replayed. Use @Res({ passthrough: true }) and return the body.',
          );
        }
      }
    }
    if (routes > 0 && this.adapterHost.httpAdapter && !this.answersAreSent()) {
      problems.push(
        'replays are answers this Nest cannot send (a web Response, which Nest 11 would send as {}): ' +
          'create the app with DirectAnswerExpressAdapter: NestFactory.create(AppModule, new DirectAnswerExpressAdapter())',
      );
    }
    if (problems.length > 0) throw new Error(`Idempotency: ${problems.join('\n')}`);
  }

  /**
   * A replay is a DirectAnswer when the adapter sends one (DirectAnswerExpressAdapter), else a web Response, which
   * Nest's router sends from Nest 12 on (RouterResponseController's `stream`; the packaged library runs on 11 too).
   */
  private answersAreSent(): boolean {
    const router = RouterResponseController.prototype as { stream?: unknown };
    return sendsDirectAnswers(this.adapterHost.httpAdapter) || typeof router.stream === 'function';
  }

  /**
   * A recovery hook needs a provider the app can resolve (found per request,
   * after the claim, it would leave the key locked for a lock TTL), and a
   * store that can tell a takeover and keep an unknown outcome (`abandon`):
   * on one that cannot (Redis), it would never run.
   */
  private recoveryProblems(options: IdempotentOptions, where: string): string[] {
    const problems: string[] = [];
    const store = options.store !== undefined ? this.options.stores?.[options.store] : this.options.store;
    if (store && !store.abandon) {
      problems.push(
        `${where}: recover needs a store that can tell a request that died (e.g. PostgreSQL); this route's store cannot, so it would never run`,
      );
    }
    try {
      this.moduleRef.get(options.recover as never, { strict: false });
    } catch {
      problems.push(
        `${where}: recover names ${options.recover?.name ?? 'a class'}, which is not a provider of the app`,
      );
    }
    return problems;
  }

  /** Nest's RouterExecutionContext.isResponseHandled. */
  private handlesResponseItself(instance: object, method: string): boolean {
    const args =
      this.contextUtils.reflectCallbackMetadata<Record<string, unknown> | undefined>(
        instance,
        method,
        ROUTE_ARGS_METADATA,
      ) ?? {};
    const takesResponse = Object.keys(args).some((key) => {
      const type = this.contextUtils.mapParamType(key);
      return type === String(RouteParamtypes.RESPONSE) || type === String(RouteParamtypes.NEXT);
    });
    return takesResponse && !this.contextUtils.reflectPassthrough(instance, method);
  }
}
