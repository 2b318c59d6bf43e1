// The Configuration table of docs/operations.md, rendered from the apps' schemas: each variable's
// meaning (`describe`) and default live next to its definition (the `env.*` helpers of libs/config).
//
//   node scripts/config-reference.mjs           rewrites the table between <!-- config:begin --> and <!-- config:end -->
//   node scripts/config-reference.mjs --check   exits 1, naming the rows that differ, when the committed table is stale
//
// test/docs/config-reference.spec.ts runs the check.
import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const DOC = 'docs/operations.md';
const COMMAND = 'node scripts/config-reference.mjs';

const require = createRequire(import.meta.url);
require('ts-node').register({ transpileOnly: true, project: join(ROOT, 'tsconfig.json') });
const paths = require('tsconfig-paths');
const tsconfig = paths.loadConfig(ROOT);
paths.register({ baseUrl: tsconfig.absoluteBaseUrl, paths: tsconfig.paths });

const { renderConfigReference, withConfigReference } = require('@app/config');

/** Every app's schema, in the order the table lists them ("all" means every one of these). */
const APP_SCHEMAS = [
  { app: 'api', schema: require('../apps/api/src/api.config.ts').apiEnvSchema },
  { app: 'worker', schema: require('../apps/worker/src/worker.config.ts').workerEnvSchema },
  { app: 'relay', schema: require('../apps/relay/src/relay.config.ts').relayEnvSchema },
  { app: 'admin', schema: require('../apps/admin/src/admin.config.ts').adminEnvSchema },
];

const path = join(ROOT, DOC);
const before = readFileSync(path, 'utf8');
const after = withConfigReference(before, renderConfigReference(APP_SCHEMAS), DOC);

if (process.argv.includes('--check')) {
  if (after !== before) {
    const had = new Set(before.split('\n'));
    const wants = new Set(after.split('\n'));
    const stale = before.split('\n').filter((l) => l.startsWith('|') && !wants.has(l));
    const missing = after.split('\n').filter((l) => l.startsWith('|') && !had.has(l));
    console.error(`${DOC}'s Configuration table differs from the apps' schemas: run ${COMMAND}`);
    for (const line of stale) console.error(`- ${line}`);
    for (const line of missing) console.error(`+ ${line}`);
    process.exit(1);
  }
  console.log(`${DOC}: the Configuration table matches the apps' schemas`);
} else {
  if (after !== before) writeFileSync(path, after);
  console.log(`${DOC}: ${after === before ? 'already up to date' : 'Configuration table rewritten'}`);
}
