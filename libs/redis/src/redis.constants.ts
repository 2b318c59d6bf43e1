import { Inject } from '@nestjs/common';

/** The shared ioredis client (non-blocking commands only). */
export const REDIS_CLIENT = 'redis:client';
export const InjectRedis = (): ParameterDecorator => Inject(REDIS_CLIENT);

/**
 * The Durability of writes that are acknowledged to a client as accepted
 * (a 202's job, an idempotency record): on a Redis Cluster, one replica
 * within 1 s by default; on one Redis, none (undefined).
 */
export const REDIS_DURABILITY = 'redis:durability';
export const InjectRedisDurability = (): ParameterDecorator => Inject(REDIS_DURABILITY);
