import { ConfigValidationError } from '@app/config';
import { loadAdminConfig } from './admin.config';

describe('admin CLI configuration', () => {
  it('has the documented defaults', () => {
    expect(loadAdminConfig({})).toMatchObject({
      redisUrl: 'redis://127.0.0.1:6379',
      databaseUrl: 'postgres://postgres@127.0.0.1:5432/postgres',
      jobStreamPartitions: 1,
    });
    expect(loadAdminConfig({ JOB_STREAM_PARTITIONS: '3' }).jobStreamPartitions).toBe(3);
  });

  it.each([
    ['DATABASE_URL', 'not a url'],
    ['REDIS_URL', 'postgres://x'],
    ['LOG_LEVEL', 'chatty'],
    ['JOB_STREAM_PARTITIONS', '0'],
  ])('rejects a malformed %s, naming it', (variable, value) => {
    try {
      loadAdminConfig({ [variable]: value });
      throw new Error('expected a ConfigValidationError');
    } catch (err) {
      expect(err).toBeInstanceOf(ConfigValidationError);
      expect((err as ConfigValidationError).problems.map((p) => p.variable)).toEqual([variable]);
    }
  });
});
