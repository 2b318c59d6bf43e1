import { Inject } from '@nestjs/common';

/** The shared ioredis client (non-blocking commands only). */
export const REDIS_CLIENT = 'redis:client';
export const InjectRedis = (): ParameterDecorator => Inject(REDIS_CLIENT);
