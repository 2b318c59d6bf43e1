import { dataSourceOptions } from '@app/persistence';
import { Client } from 'pg';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { startApi } from '../support/api-harness';
import { BASE_DATABASE_URL, testDatabaseName } from '../support/infra';

/*
 * A pod of a new release can start before the migration Job has finished.
 * Readiness says so: PostgreSQL answering is not enough, the schema must be
 * the one this build ships.
 */
describe('readiness and the database schema', () => {
  const name = `${testDatabaseName()}_unmigrated`;
  const url = (() => {
    const u = new URL(BASE_DATABASE_URL);
    u.pathname = `/${name}`;
    return u.toString();
  })();
  const admin = async (sql: string) => {
    const c = new Client({ connectionString: BASE_DATABASE_URL });
    await c.connect();
    try {
      await c.query(sql);
    } finally {
      await c.end();
    }
  };

  beforeAll(() => admin(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).then(() => admin(`CREATE DATABASE ${name}`)));
  afterAll(() => admin(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`));

  it('is not ready on an empty database, nor with a migration missing, and is once every migration is applied', async () => {
    const api = await startApi({ env: { DATABASE_URL: url } });
    const migrator = new DataSource(dataSourceOptions({ url, applicationName: 'test-migrator' }));
    await migrator.initialize();
    try {
      const empty = await request(api.server).get('/health/ready').expect(503);
      expect(empty.body.failing).toEqual(['postgres']);
      expect(JSON.stringify(empty.body.checks.postgres)).toContain('schema not migrated');

      await migrator.runMigrations();
      const ready = await request(api.server).get('/health/ready').expect(200);
      // The api's own list: Redis and PostgreSQL.
      expect(Object.keys(ready.body.details).sort()).toEqual(['postgres', 'redis']);

      // The newest migration undone: an older schema than this build's.
      await migrator.undoLastMigration();
      const behind = await request(api.server).get('/health/ready').expect(503);
      expect(JSON.stringify(behind.body.checks.postgres)).toContain(
        migrator.migrations[migrator.migrations.length - 1].name,
      );
    } finally {
      await migrator.destroy();
      await api.close();
    }
  });
});
