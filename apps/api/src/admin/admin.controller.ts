import {
  Controller,
  DefaultValuePipe,
  Get,
  HttpCode,
  HttpStatus,
  NotFoundException,
  Param,
  ParseIntPipe,
  Post,
  Query,
  UseGuards,
} from '@nestjs/common';
import { ApiBearerAuth, ApiOperation, ApiTags } from '@nestjs/swagger';
import { OperationsService, type SystemFigures } from '@app/operations';
import { ProblemException, PROBLEM_TYPE_PREFIX } from '@app/problem';
import { AdminKeyGuard } from './admin-key.guard';

const STREAM_ID = /^\d{1,20}-\d{1,20}$/;
const ROW_ID = /^\d{1,19}$/;

/** For operators: the figures, the dead letters, the parked outbox rows, and the two repairs. */
@ApiTags('admin')
@ApiBearerAuth()
@Controller('admin')
@UseGuards(AdminKeyGuard)
export class AdminController {
  constructor(private readonly ops: OperationsService) {}

  @Get('stats')
  @ApiOperation({ summary: 'Queue and outbox figures' })
  stats(): Promise<SystemFigures> {
    return this.ops.figures();
  }

  @Get('dead-letters')
  @ApiOperation({ summary: 'Dead letters, oldest first, with their reason; page with ?after=<last id>' })
  async deadLetters(
    @Query('count', new DefaultValuePipe(50), ParseIntPipe) count: number,
    @Query('after') after?: string,
  ) {
    if (after !== undefined && !STREAM_ID.test(after)) throw new NotFoundException('after must be a dead-letter id');
    return { dead_letters: await this.ops.listDeadLetters(Math.min(Math.max(count, 1), 500), after) };
  }

  @Post('dead-letters/redrive')
  @HttpCode(HttpStatus.OK)
  @ApiOperation({ summary: 'Re-drive every dead letter that can run again' })
  redriveAll() {
    return this.ops.redriveAll('admin-api');
  }

  @Post('dead-letters/:id/redrive')
  @HttpCode(HttpStatus.OK)
  @ApiOperation({ summary: 'Re-drive one dead letter into the job stream, keeping its job id' })
  async redrive(@Param('id') id: string) {
    if (!STREAM_ID.test(id)) throw new NotFoundException('No such dead letter.');
    const result = await this.ops.redrive(id, 'admin-api');
    if (result.outcome === 'not_found') throw new NotFoundException('No such dead letter.');
    if (result.outcome === 'not_redrivable') {
      throw new ProblemException({
        type: `${PROBLEM_TYPE_PREFIX}dead-letter-not-redrivable`,
        title: 'This dead letter has no job to run',
        status: HttpStatus.CONFLICT,
        detail: `It was recorded by id only (reason ${result.reason ?? 'unknown'}); there is nothing to re-drive.`,
      });
    }
    return { dead_letter: id, job_id: result.jobId, entry: result.entryId };
  }

  @Get('outbox/parked')
  @ApiOperation({ summary: 'Outbox rows that ran out of attempts' })
  async parked(@Query('count', new DefaultValuePipe(50), ParseIntPipe) count: number) {
    return { parked: await this.ops.listParked(Math.min(Math.max(count, 1), 500)) };
  }

  @Post('outbox/requeue')
  @HttpCode(HttpStatus.OK)
  @ApiOperation({ summary: 'Re-queue every parked outbox row' })
  async requeueAll() {
    return { requeued: await this.ops.requeue('admin-api') };
  }

  @Post('outbox/:id/requeue')
  @HttpCode(HttpStatus.OK)
  @ApiOperation({ summary: 'Re-queue one parked outbox row: fresh attempts, due now' })
  async requeue(@Param('id') id: string) {
    if (!ROW_ID.test(id)) throw new NotFoundException('No such parked row.');
    const ids = await this.ops.requeue('admin-api', id);
    if (ids.length === 0) throw new NotFoundException('No such parked row.');
    return { requeued: ids };
  }
}
