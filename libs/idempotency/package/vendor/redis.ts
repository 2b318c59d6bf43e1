/* What the package takes from libs/redis (see problem.ts): not the module, its config or its metrics. */
export { connectionNameOf, duplicateForBlocking, type RedisClient } from '../../../redis/src/create-redis-client';
export { type Durability, NotReplicatedError, RedisScript } from '../../../redis/src/redis-script';
export { hashTagFor, keySlot } from '../../../redis/src/partition-tags';
