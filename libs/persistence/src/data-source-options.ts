import type { DataSourceOptions } from 'typeorm';
import { Outbox } from './entities/outbox.entity';
import { Summary } from './entities/summary.entity';
import { InitialSchema1764460800000 } from './migrations/1764460800000-initial-schema';
import { OutboxParkedIndex1764547200000 } from './migrations/1764547200000-outbox-parked-index';
import { IdempotencyKeys1764633600000 } from './migrations/1764633600000-idempotency-keys';
import { Refunds1764720000000 } from './migrations/1764720000000-refunds';
import { RefundAttempts1764806400000 } from './migrations/1764806400000-refund-attempts';
import { IdempotencyBytes1764892800000 } from './migrations/1764892800000-idempotency-bytes';
import { Workflows1764979200000 } from './migrations/1764979200000-workflows';
import { GatewayRecords1765065600000 } from './migrations/1765065600000-gateway-records';
import { OutboxTraceparent1765152000000 } from './migrations/1765152000000-outbox-traceparent';

export const ENTITIES = [Summary, Outbox];
/** Listed, not globbed: the apps are bundled, so there is no directory to scan. */
export const MIGRATIONS = [
  InitialSchema1764460800000,
  OutboxParkedIndex1764547200000,
  IdempotencyKeys1764633600000,
  Refunds1764720000000,
  RefundAttempts1764806400000,
  IdempotencyBytes1764892800000,
  Workflows1764979200000,
  GatewayRecords1765065600000,
  OutboxTraceparent1765152000000,
];

/** The longest the client waits for one query's answer: what bounds a request that reads PostgreSQL. */
export const QUERY_TIMEOUT_MS = 20_000;

export interface PersistenceOptions {
  readonly url: string;
  /** Shown in pg_stat_activity. */
  readonly applicationName: string;
  readonly poolSize?: number;
}

export function dataSourceOptions(options: PersistenceOptions): DataSourceOptions {
  return {
    type: 'postgres',
    url: options.url,
    applicationName: options.applicationName,
    entities: ENTITIES,
    migrations: MIGRATIONS,
    migrationsTableName: 'migrations',
    synchronize: false,
    migrationsRun: false,
    extra: {
      max: options.poolSize ?? 10,
      connectionTimeoutMillis: 5000,
      // A statement that hangs must not hold a pooled connection for ever.
      statement_timeout: 15000,
      // ...and neither may a server that stopped answering (a partition, a
      // host gone without a reset): the client gives up a little after the
      // server would have, and TCP keepalives notice a dead peer in seconds,
      // not the kernel's two hours. Without them a hung query stops a
      // worker's or relay's loop and liveness restarts a pod whose only
      // trouble is its database.
      query_timeout: QUERY_TIMEOUT_MS,
      keepAlive: true,
      keepAliveInitialDelayMillis: 10000,
    },
  };
}
