/*
 * @llm-workflows/nestjs-idempotency/testing: the conformance kit, for jest
 * (its describe/it/expect globals). Routes are driven with supertest, an
 * optional peer.
 */
export * from '../src/testing/idempotency-store.contract';
export * from '../src/testing/idempotent-route.conformance';
