// The DataSource the TypeORM CLI uses (`npm run migration:run`).
import { commonEnv, parseConfig, processEnv } from '@app/config';
import { dataSourceOptions } from '@app/persistence';
import { DataSource } from 'typeorm';

const { databaseUrl } = parseConfig({ databaseUrl: commonEnv.databaseUrl }, processEnv());

export default new DataSource(dataSourceOptions({ url: databaseUrl, applicationName: 'migrations' }));
