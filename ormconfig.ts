// The DataSource of `npm run migration:run` (scripts/migrate.ts) and of the TypeORM CLI (`-d ormconfig.ts`).
import { commonEnv, parseConfig, processEnv } from '@app/config';
import { dataSourceOptions } from '@app/persistence';
import { DataSource } from 'typeorm';

const { databaseUrl } = parseConfig({ databaseUrl: commonEnv.databaseUrl }, processEnv());

export default new DataSource(dataSourceOptions({ url: databaseUrl, applicationName: 'migrations' }));
