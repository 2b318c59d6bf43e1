// npm run migration:run: applies the pending migrations to DATABASE_URL, all
// in one transaction (as TypeORM's CLI does), and prints one line per
// migration applied. Not the CLI itself: its migration:run turns query
// logging on whatever the DataSource says, and echoes every statement of
// every migration (a hundred lines of SQL on a fresh database).
import dataSource from '../ormconfig';

async function main(): Promise<void> {
  await dataSource.initialize();
  try {
    const applied = await dataSource.runMigrations({ transaction: 'all' });
    for (const migration of applied) process.stdout.write(`migration ${migration.name}: applied\n`);
    if (applied.length === 0) process.stdout.write('migrations: none pending\n');
  } finally {
    await dataSource.destroy();
  }
}

main().catch((err: unknown) => {
  // All in one transaction: a failure leaves every migration of this run unapplied.
  process.stderr.write(`migrations: none applied: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
});
