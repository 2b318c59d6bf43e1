import {
  type OperationsService,
  parseDeadLetterId,
  type ParsedId,
  parseOutboxRowId,
  parseWorkflowName,
} from '@app/operations';

export class UsageError extends Error {}

export const USAGE = `usage: admin <command>

  migrate                          apply the database migrations
  stats [--workflow NAME]          queues (in total and by partition) and outbox
                                   figures; with a workflow, its dead letters and
                                   failed runs too
  dead-letters list [--count N] [--after ID] [--workflow NAME]
                                   dead letters of every queue and partition,
                                   oldest first, with their reason; next (when
                                   set) is the --after of the next page
  dead-letters show ID             one dead letter with every field of its entry
  dead-letters redrive ID          put one back into its partition's job stream
                                   (same job id, every field kept)
  dead-letters redrive --all [--workflow NAME]
                                   every dead letter (of the workflow) that can
                                   run again, up to the newest as it starts
  outbox parked [--count N]        outbox rows that ran out of attempts
  outbox requeue ID                give one parked row fresh attempts, due now
  outbox requeue --all             every parked row

A dead-letter ID is <ms>-<seq> with one job stream partition, and
<partition>:<ms>-<seq> (as listed) with JOB_STREAM_PARTITIONS above 1; set
JOB_STREAM_PARTITIONS as for the api and the worker. A dead letter of a queue
other than summaries names it first: workflows/<ms>-<seq>. A dead letter's
workflow (--workflow) is its workflow field, or its queue's name (summaries).

Output is JSON on stdout; the exit code is 0 on success, 1 when the thing
named was not found or could not be done, 2 on a usage error.`;

export interface CommandResult {
  readonly output: unknown;
  /** 0 done, 1 not found or not possible. */
  readonly exitCode: 0 | 1;
}

function option(args: string[], name: string): string | undefined {
  const i = args.indexOf(name);
  if (i < 0) return undefined;
  const value = args[i + 1];
  if (value === undefined || value.startsWith('--')) throw new UsageError(`${name} needs a value`);
  args.splice(i, 2);
  return value;
}

function count(args: string[]): number {
  const raw = option(args, '--count') ?? '50';
  if (!/^\d+$/.test(raw) || Number(raw) < 1 || Number(raw) > 10_000) throw new UsageError('--count must be 1 to 10000');
  return Number(raw);
}

/** An id that can exist (the API answers any other with a 400), else a usage error naming the argument. */
function checkedId(name: string, raw: string, parse: (raw: string) => ParsedId): string {
  const parsed = parse(raw);
  if (!parsed.ok) throw new UsageError(`${name} ${parsed.message}`);
  return parsed.id;
}

/** --workflow, checked, or undefined. */
function workflow(args: string[]): string | undefined {
  const raw = option(args, '--workflow');
  return raw === undefined ? undefined : checkedId('--workflow', raw, parseWorkflowName);
}

/** The one ID named, or undefined for --all. */
function target(args: string[], parse: (raw: string) => ParsedId, what: string): string | undefined {
  if (args.length !== 1 || (args[0].startsWith('--') && args[0] !== '--all'))
    throw new UsageError(`give one ${what} or --all`);
  return args[0] === '--all' ? undefined : checkedId('ID', args[0], parse);
}

/** Runs one command (not `migrate`, which main.ts handles) against the operations. */
export async function runCommand(ops: OperationsService, argv: readonly string[]): Promise<CommandResult> {
  // `stats` alone is a command of one word: what follows it is options.
  const [group, verb, ...rest] = argv[0] === 'stats' ? ['stats', '', ...argv.slice(1)] : argv;
  const args = [...rest];
  const done = (output: unknown): CommandResult => ({ output, exitCode: 0 });
  switch (`${group} ${verb ?? ''}`.trim()) {
    case 'stats': {
      const name = workflow(args);
      if (args.length) throw new UsageError(`unexpected ${args.join(' ')}`);
      return done(await ops.figures(name === undefined ? {} : { workflow: name }));
    }
    case 'dead-letters list': {
      const n = count(args);
      const raw = option(args, '--after');
      const after = raw === undefined || raw === '' ? undefined : checkedId('--after', raw, parseDeadLetterId);
      const name = workflow(args);
      if (args.length) throw new UsageError(`unexpected ${args.join(' ')}`);
      const page = await ops.listDeadLetters(n, after, name === undefined ? {} : { workflow: name });
      return done(
        page.next === undefined ? { dead_letters: page.letters } : { dead_letters: page.letters, next: page.next },
      );
    }
    case 'dead-letters show': {
      if (args.length !== 1 || args[0].startsWith('--')) throw new UsageError('give one dead-letter id');
      const letter = await ops.inspectDeadLetter(checkedId('ID', args[0], parseDeadLetterId));
      return letter ? done(letter) : { output: { outcome: 'not_found' }, exitCode: 1 };
    }
    case 'dead-letters redrive': {
      const name = workflow(args);
      const id = target(args, parseDeadLetterId, 'dead-letter id');
      if (id !== undefined && name !== undefined) throw new UsageError('--workflow goes with --all');
      if (id === undefined) {
        // The API bounds one call; the CLI has no time limit, so it walks to the end: the end as it starts,
        // so that a dead letter that fails again at once, dead-lettered anew, is not re-driven again and again.
        const until = await ops.deadLetterBounds();
        let redriven = 0;
        const notRedrivable: string[] = [];
        let after: string | undefined;
        do {
          const part = await ops.redriveAll('admin-cli', { after, workflow: name, until });
          redriven += part.redriven;
          notRedrivable.push(...part.notRedrivable);
          after = part.next;
        } while (after !== undefined);
        return done({ redriven, notRedrivable });
      }
      const result = await ops.redrive(id, 'admin-cli');
      return { output: result, exitCode: result.outcome === 'redriven' ? 0 : 1 };
    }
    case 'outbox parked': {
      const n = count(args);
      if (args.length) throw new UsageError(`unexpected ${args.join(' ')}`);
      return done({ parked: await ops.listParked(n) });
    }
    case 'outbox requeue': {
      const id = target(args, parseOutboxRowId, 'outbox row id');
      const requeued = await ops.requeue('admin-cli', id);
      return { output: { requeued }, exitCode: id !== undefined && requeued.length === 0 ? 1 : 0 };
    }
    default:
      throw new UsageError(argv.length ? `unknown command: ${argv.join(' ')}` : 'no command');
  }
}
