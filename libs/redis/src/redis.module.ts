import { Inject, Logger, Module, OnApplicationShutdown, OnModuleInit, Optional } from '@nestjs/common';
import { Registry } from 'prom-client';
import { connectOrContinue, createRedisClient, type RedisClient } from './create-redis-client';
import type { Durability } from './redis-script';
import { REDIS_CLIENT, REDIS_DURABILITY } from './redis.constants';
import { ConfigurableModuleClass, REDIS_MODULE_OPTIONS, type RedisModuleOptions } from './redis.module-definition';
import { MasterReplicas } from './master-replicas';

/**
 * On a cluster a 202 must survive the loss of a master (INTERFACE.md): its writes wait for one replica, when the
 * master has one. 1 s bounds the wait when replication lags; a replica that does not answer by then gets the client a
 * 503, not a hang.
 */
function clusterDurability(options: RedisModuleOptions, registry: Registry | undefined): Durability {
  return {
    replicas: 1,
    timeoutMs: 1000,
    mode: options.durabilityMode ?? 'replica',
    masters: new MasterReplicas(registry),
  };
}

@Module({
  providers: [
    {
      provide: REDIS_CLIENT,
      inject: [REDIS_MODULE_OPTIONS],
      useFactory: (options: RedisModuleOptions) => createRedisClient(options),
    },
    {
      provide: REDIS_DURABILITY,
      // The app's metrics registry (MetricsModule), where it has one: redis_unreplicated_writes_total.
      inject: [REDIS_MODULE_OPTIONS, { token: Registry, optional: true }],
      useFactory: (options: RedisModuleOptions, registry?: Registry) =>
        options.durability ?? (options.clusterNodes?.nodes.length ? clusterDurability(options, registry) : undefined),
    },
  ],
  exports: [REDIS_CLIENT, REDIS_DURABILITY],
})
export class RedisModule extends ConfigurableModuleClass implements OnModuleInit, OnApplicationShutdown {
  private readonly logger = new Logger(RedisModule.name);

  constructor(
    @Inject(REDIS_CLIENT) private readonly client: RedisClient,
    @Inject(REDIS_MODULE_OPTIONS) private readonly options: RedisModuleOptions,
    @Optional() @Inject(REDIS_DURABILITY) private readonly durability?: Durability,
  ) {
    super();
    // Without a listener ioredis prints every reconnect failure to stderr. An
    // outage is logged when it starts and when it ends, not at every retry.
    let failing: string | undefined;
    client.on('error', (err: Error) => {
      if (failing === err.message) return;
      failing = err.message;
      this.logger.warn(`Redis: ${err.message}; reconnecting`);
    });
    client.on('ready', () => {
      if (failing !== undefined) this.logger.log('Redis: connected again');
      failing = undefined;
    });
  }

  async onModuleInit(): Promise<void> {
    const ready = await connectOrContinue(this.client, this.options.connectTimeoutMs ?? 5000);
    if (!ready) this.logger.warn('Redis is not reachable yet; starting unready and retrying');
  }

  async onApplicationShutdown(): Promise<void> {
    this.durability?.masters?.close();
    if (this.client.status === 'ready') {
      await this.client.quit().catch(() => this.client.disconnect());
    } else {
      this.client.disconnect();
    }
  }
}
