import { dataSourceOptions } from '@app/persistence';
import type { Client } from 'pg';
import { DataSource } from 'typeorm';

/**
 * Database `name` beside `baseUrl`'s, made afresh (an old one dropped, its
 * connections with it) and migrated; its URL. `admin` is a connection to
 * the server's maintenance database: the tests' global setup makes one per
 * jest worker with it, each bench its own.
 */
export async function freshMigratedDatabase(
  admin: Client,
  baseUrl: string,
  name: string,
  applicationName: string,
): Promise<string> {
  await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  await admin.query(`CREATE DATABASE ${name}`);
  const url = new URL(baseUrl);
  url.pathname = `/${name}`;
  const ds = new DataSource(dataSourceOptions({ url: url.toString(), applicationName }));
  await ds.initialize();
  await ds.runMigrations();
  await ds.destroy();
  return url.toString();
}
