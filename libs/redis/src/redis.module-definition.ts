import type { RedisClusterConfig } from '@app/config';
import type { DurabilityMode } from './durable-write-decision';
import type { Durability } from './redis-script';
import { ConfigurableModuleBuilder } from '@nestjs/common';

export interface RedisModuleOptions {
  /** redis:// or rediss:// URL, database number included (`/2`); ignored when clusterNodes are given. */
  readonly url: string;
  /**
   * A Redis Cluster (REDIS_CLUSTER_NODES): its seed nodes, credentials and TLS. Given with at least one node, the
   * client is a cluster client.
   */
  readonly clusterNodes?: RedisClusterConfig;
  /**
   * What an accepted write waits for (provided as REDIS_DURABILITY); default: one replica within 1 s on a
   * cluster, none on one Redis.
   */
  readonly durability?: Durability;
  /**
   * REDIS_DURABILITY, for the default durability on a cluster: `replica` (the default) lets a write stand on a
   * master with no replica online, counted in `redis_unreplicated_writes_total`; `strict` refuses it.
   */
  readonly durabilityMode?: DurabilityMode;
  /** Shown in CLIENT LIST, so an operator can tell the apps apart. */
  readonly connectionName: string;
  /**
   * A command that gets no answer in this time fails instead of hanging the
   * request. Blocking reads use their own connection (see `duplicate()`).
   */
  readonly commandTimeoutMs?: number;
  /** Batch the commands sent in one event-loop turn into one write (default true); see createRedisClient. */
  readonly autoPipelining?: boolean;
  /** How long start-up waits for the first connection before going on unready. */
  readonly connectTimeoutMs?: number;
}

export const { ConfigurableModuleClass, MODULE_OPTIONS_TOKEN: REDIS_MODULE_OPTIONS } =
  new ConfigurableModuleBuilder<RedisModuleOptions>()
    .setClassMethodName('forRoot')
    .setExtras({ isGlobal: true }, (definition, extras) => ({ ...definition, global: extras.isGlobal }))
    .build();
