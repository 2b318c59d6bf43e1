import {
  applyDecorators,
  Controller,
  Get,
  HttpCode,
  HttpStatus,
  NotFoundException,
  Param,
  type PipeTransform,
  Post,
  Query,
  UseGuards,
  UseInterceptors,
} from '@nestjs/common';
import { ApiBearerAuth, ApiOkResponse, ApiOperation, ApiParam, ApiQuery, ApiTags } from '@nestjs/swagger';
import {
  OperationsService,
  parseDeadLetterId,
  type ParsedId,
  parseOutboxRowId,
  parseWorkflowName,
  REDRIVE_ALL_DEFAULT_LIMIT,
  type RedriveAllResult,
  type SystemFigures,
} from '@app/operations';
import { ApiProblemResponse, ProblemException, PROBLEM_TYPE_PREFIX, validationProblem } from '@app/problem';
import { NoSuchPartitionError, NoSuchQueueError } from '@app/summary-queue';
import { ADMIN_KEY_AUTH } from '../openapi';
import { AdminKeyGuard } from './admin-key.guard';
import { DependencyUnavailableInterceptor } from './dependency-unavailable.interceptor';
import {
  DeadLetterDetailDto,
  DeadLetterListDto,
  ParkedListDto,
  RedriveAllDto,
  RedrivenDto,
  RequeuedDto,
  SystemFiguresDto,
} from './admin-responses.dto';

const LIST_MAX = 500;
const REDRIVE_ALL_MAX = 10_000;

/** An optional integer query parameter within [1, max]; anything else is a 400 naming it. */
class IntQuery implements PipeTransform<string | undefined, number> {
  constructor(
    private readonly name: string,
    private readonly fallback: number,
    private readonly max: number,
  ) {}

  transform(value: string | undefined): number {
    if (value === undefined || value === '') return this.fallback;
    if (!/^\d{1,9}$/.test(value) || Number(value) < 1 || Number(value) > this.max) {
      throw validationProblem([{ field: this.name, messages: [`must be a whole number from 1 to ${this.max}`] }]);
    }
    return Number(value);
  }
}

/**
 * An id parameter (path, or optional query) that can exist; anything else is a
 * 400 naming it, so that it never reaches Redis or PostgreSQL as a store error.
 */
class IdParam implements PipeTransform<string | undefined, string | undefined> {
  constructor(
    private readonly name: string,
    private readonly parse: (raw: string) => ParsedId,
  ) {}

  transform(value: string | undefined): string | undefined {
    if (value === undefined || value === '') return undefined;
    const parsed = this.parse(value);
    if (!parsed.ok) throw validationProblem([{ field: this.name, messages: [parsed.message] }]);
    return parsed.id;
  }
}

const DEAD_LETTER_ID =
  '<ms>-<seq> (each part at most 18446744073709551615) with one job stream partition; ' +
  '<partition>:<ms>-<seq> with JOB_STREAM_PARTITIONS above 1, as listed; a queue other than summaries ' +
  'comes first, workflows/<ms>-<seq> (the slash URL-encoded, %2F, or as a path segment of its own)';

const WORKFLOW_QUERY = {
  name: 'workflow',
  required: false,
  description: "Only this workflow's: a dead letter's workflow field, or its queue's name (summaries)",
} as const;

/** A workflow filter; an empty or absent one is none. */
const workflowFilter = (name: string | undefined) => (name === undefined ? {} : { workflow: name });

/** A dead-letter id given as two path segments, `<queue>/<id>`: the id without its slash encoded. */
class QueuedIdParam implements PipeTransform<Record<string, string>, string> {
  transform(params: Record<string, string>): string {
    const id = `${params.queue}/${params.id}`;
    const parsed = parseDeadLetterId(id);
    if (!parsed.ok) throw validationProblem([{ field: 'id', messages: [parsed.message] }]);
    return parsed.id;
  }
}

/**
 * A dead-letter id that names no queue or partition of this system is a 404,
 * as an id no dead letter has, whose type says which.
 */
async function inSomePartition<T>(work: () => Promise<T>): Promise<T> {
  try {
    return await work();
  } catch (err) {
    if (err instanceof NoSuchQueueError) {
      throw new ProblemException({
        type: `${PROBLEM_TYPE_PREFIX}no-such-queue`,
        title: 'No such queue',
        status: HttpStatus.NOT_FOUND,
        detail: `${err.message}.`,
      });
    }
    if (!(err instanceof NoSuchPartitionError)) throw err;
    throw new ProblemException({
      type: `${PROBLEM_TYPE_PREFIX}no-such-partition`,
      title: 'No such job stream partition',
      status: HttpStatus.NOT_FOUND,
      detail: `${err.message}.`,
    });
  }
}

/** The paging parameters of the two walks over the dead letters: the listing and the bulk re-drive. */
const ApiDeadLetterWalk = (limit: { name: string; description: string }, what: string) =>
  applyDecorators(
    ApiQuery({ name: limit.name, required: false, description: limit.description }),
    ApiQuery({ name: 'after', required: false, description: `Start after this dead-letter id (${what}'s next)` }),
    ApiQuery(WORKFLOW_QUERY),
    ApiProblemResponse(400, `${limit.name} or workflow is malformed, or after is not an id that can exist`),
    ApiProblemResponse(404, 'after names a queue or partition this system does not have'),
  );

/** One dead letter named by its id: `:id` alone (a slash encoded), or `:queue/:id` for another queue than summaries. */
const ApiDeadLetterId = (queued: boolean) =>
  queued
    ? applyDecorators(
        ApiParam({ name: 'queue', description: 'The queue, e.g. workflows' }),
        ApiParam({ name: 'id', description: 'The rest of the dead-letter id, <ms>-<seq> or <partition>:<ms>-<seq>' }),
        ApiProblemResponse(400, 'queue/id is not a dead-letter id that can exist'),
        ApiProblemResponse(404, 'No such dead letter, or no such queue or partition'),
      )
    : applyDecorators(
        ApiParam({ name: 'id', description: `The dead-letter id: ${DEAD_LETTER_ID}` }),
        ApiProblemResponse(400, 'id is not a dead-letter id that can exist'),
        ApiProblemResponse(404, 'No such dead letter, or no such queue or partition'),
      );

/** GET one dead letter. */
const ApiInspectDeadLetter = (summary: string, queued: boolean) =>
  applyDecorators(ApiOperation({ summary }), ApiDeadLetterId(queued), ApiOkResponse({ type: DeadLetterDetailDto }));

/** POST a re-drive of one dead letter. */
const ApiRedriveDeadLetter = (summary: string, queued: boolean) =>
  applyDecorators(
    HttpCode(HttpStatus.OK),
    ApiOperation({ summary }),
    ApiDeadLetterId(queued),
    ApiOkResponse({ type: RedrivenDto }),
    ApiProblemResponse(409, 'The dead letter was recorded by id only; there is no job to run'),
  );

const OTHER_QUEUE = 'The same, for a dead letter of another queue than summaries: workflows/<id>';

/** For operators: the figures, the dead letters, the parked outbox rows, and the two repairs. */
@ApiTags('admin')
@ApiBearerAuth(ADMIN_KEY_AUTH)
@ApiProblemResponse(401, 'No or wrong admin key (tenant keys are refused)')
@ApiProblemResponse(503, 'Redis or PostgreSQL did not answer')
@Controller('admin')
@UseGuards(AdminKeyGuard)
@UseInterceptors(DependencyUnavailableInterceptor)
export class AdminController {
  constructor(private readonly ops: OperationsService) {}

  @Get('stats')
  @ApiOperation({ summary: "Queue and outbox figures; with ?workflow=, that workflow's dead letters and failed runs" })
  @ApiQuery(WORKFLOW_QUERY)
  @ApiOkResponse({ type: SystemFiguresDto })
  @ApiProblemResponse(400, 'workflow is not a workflow name')
  stats(@Query('workflow', new IdParam('workflow', parseWorkflowName)) workflow?: string): Promise<SystemFigures> {
    return this.ops.figures(workflowFilter(workflow));
  }

  @Get('dead-letters')
  @ApiOperation({
    summary:
      'Dead letters of every queue and partition, oldest first, with their reason; page with ?after=<next> (or the last id)',
    description:
      'With ?workflow=, a page looks at up to 1000 dead letters (count, if more) and may hold fewer than count: ' +
      'next, when set, is where the next page starts (the last one looked at, of whichever workflow).',
  })
  @ApiDeadLetterWalk({ name: 'count', description: `Page size, 1 to ${LIST_MAX}; default 50` }, 'a previous page')
  @ApiOkResponse({ type: DeadLetterListDto })
  async deadLetters(
    @Query('count', new IntQuery('count', 50, LIST_MAX)) count: number,
    @Query('after', new IdParam('after', parseDeadLetterId)) after?: string,
    @Query('workflow', new IdParam('workflow', parseWorkflowName)) workflow?: string,
  ) {
    const page = await inSomePartition(() => this.ops.listDeadLetters(count, after, workflowFilter(workflow)));
    return page.next === undefined ? { dead_letters: page.letters } : { dead_letters: page.letters, next: page.next };
  }

  @Post('dead-letters/redrive')
  @HttpCode(HttpStatus.OK)
  @ApiOperation({
    summary: 'Re-drive every dead letter that can run again',
    description:
      `Looks at up to ?limit= dead letters (default ${REDRIVE_ALL_DEFAULT_LIMIT}), of any workflow, per call, so a call ` +
      "stays short; when more remain, the answer's next is the ?after= of the next call. A call goes no further than " +
      'the newest dead letter as it starts.',
  })
  @ApiDeadLetterWalk(
    {
      name: 'limit',
      description: `Dead letters to look at, 1 to ${REDRIVE_ALL_MAX}; default ${REDRIVE_ALL_DEFAULT_LIMIT}`,
    },
    'a previous answer',
  )
  @ApiOkResponse({ type: RedriveAllDto })
  redriveAll(
    @Query('limit', new IntQuery('limit', REDRIVE_ALL_DEFAULT_LIMIT, REDRIVE_ALL_MAX)) limit: number,
    @Query('after', new IdParam('after', parseDeadLetterId)) after?: string,
    @Query('workflow', new IdParam('workflow', parseWorkflowName)) workflow?: string,
  ): Promise<RedriveAllResult> {
    return inSomePartition(() => this.ops.redriveAll('admin-api', { limit, after, workflow }));
  }

  @Get('dead-letters/:id')
  @ApiInspectDeadLetter('One dead letter with every field of its entry (workflow, step, state, payload, ...)', false)
  inspect(@Param('id', new IdParam('id', parseDeadLetterId)) id: string) {
    return this.inspectOne(id);
  }

  @Get('dead-letters/:queue/:id')
  @ApiInspectDeadLetter(OTHER_QUEUE, true)
  inspectQueued(@Param(new QueuedIdParam()) id: string) {
    return this.inspectOne(id);
  }

  @Post('dead-letters/:id/redrive')
  @ApiRedriveDeadLetter(
    "Re-drive one dead letter into its queue's and partition's job stream, keeping every field (job id, workflow, step, state)",
    false,
  )
  redrive(@Param('id', new IdParam('id', parseDeadLetterId)) id: string) {
    return this.redriveOne(id);
  }

  @Post('dead-letters/:queue/:id/redrive')
  @ApiRedriveDeadLetter(OTHER_QUEUE, true)
  redriveQueued(@Param(new QueuedIdParam()) id: string) {
    return this.redriveOne(id);
  }

  private async inspectOne(id: string) {
    const letter = await inSomePartition(() => this.ops.inspectDeadLetter(id));
    if (!letter) throw new NotFoundException('No such dead letter.');
    return letter;
  }

  private async redriveOne(id: string) {
    const result = await inSomePartition(() => this.ops.redrive(id, 'admin-api'));
    if (result.outcome === 'not_found') throw new NotFoundException('No such dead letter.');
    if (result.outcome === 'not_redrivable') {
      throw new ProblemException({
        type: `${PROBLEM_TYPE_PREFIX}dead-letter-not-redrivable`,
        title: 'This dead letter has no job to run',
        status: HttpStatus.CONFLICT,
        detail: `It was recorded by id only (reason ${result.reason ?? 'unknown'}); there is nothing to re-drive.`,
      });
    }
    // The id as listed: a `summaries/` prefix, which the queue's own ids do not carry, is dropped.
    return { dead_letter: result.deadLetter, job_id: result.jobId, workflow: result.workflow, entry: result.entryId };
  }

  @Get('outbox/parked')
  @ApiOperation({ summary: 'Outbox rows that ran out of attempts' })
  @ApiQuery({ name: 'count', required: false, description: `How many, 1 to ${LIST_MAX}; default 50` })
  @ApiOkResponse({ type: ParkedListDto })
  @ApiProblemResponse(400, 'count is malformed')
  async parked(@Query('count', new IntQuery('count', 50, LIST_MAX)) count: number) {
    return { parked: await this.ops.listParked(count) };
  }

  @Post('outbox/requeue')
  @HttpCode(HttpStatus.OK)
  @ApiOperation({ summary: 'Re-queue every parked outbox row' })
  @ApiOkResponse({ type: RequeuedDto })
  async requeueAll() {
    return { requeued: await this.ops.requeue('admin-api') };
  }

  @Post('outbox/:id/requeue')
  @HttpCode(HttpStatus.OK)
  @ApiOperation({ summary: 'Re-queue one parked outbox row: fresh attempts, due now' })
  @ApiParam({ name: 'id', description: 'The outbox row id, 1 to 9223372036854775807' })
  @ApiOkResponse({ type: RequeuedDto })
  @ApiProblemResponse(400, 'id is not an outbox row id that can exist')
  @ApiProblemResponse(404, 'No such parked row')
  async requeue(@Param('id', new IdParam('id', parseOutboxRowId)) id: string) {
    const ids = await this.ops.requeue('admin-api', id);
    if (ids.length === 0) throw new NotFoundException('No such parked row.');
    return { requeued: ids };
  }
}
