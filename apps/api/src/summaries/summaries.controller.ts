import { Body, Controller, Get, HttpCode, HttpStatus, Param, Post, Res, UseGuards } from '@nestjs/common';
import { ApiAcceptedResponse, ApiBearerAuth, ApiOkResponse, ApiTags } from '@nestjs/swagger';
import { IdempotencyContext, Idempotent, type IdempotencyRequestContext } from '@app/idempotency';
import type { SummaryJobPayload } from '@app/summary-queue';
import { ApiProblemResponse } from '@app/problem';
import { InjectWorkflow, WorkflowHandle } from '@app/workflows';
import type { Response } from 'express';
import { ApiKeyGuard } from '../auth/api-key.guard';
import { TENANT_KEY_AUTH } from '../openapi';
import { Tenant } from '../auth/principal';
import { rethrowNotQueued } from '../runs/run-not-queued.problem';
import { CreateSummaryDto } from './create-summary.dto';
import { JobAcceptedDto, SummaryStatusDto } from './summary-responses.dto';
import { SummaryStatus, SummaryStatusService } from './summary-status.service';

export interface JobAccepted {
  readonly job_id: string;
  readonly status: 'queued';
}

@ApiTags('summaries')
@ApiBearerAuth(TENANT_KEY_AUTH)
@ApiProblemResponse(401, 'No or unknown API key')
@Controller('v1/summaries')
@UseGuards(ApiKeyGuard)
export class SummariesController {
  constructor(
    @InjectWorkflow('summaries') private readonly summaries: WorkflowHandle<SummaryJobPayload>,
    private readonly status: SummaryStatusService,
  ) {}

  /**
   * Accepts a summarisation job: a run of the summaries workflow, on its own
   * queue, whose entry (job_id, tenant, payload) and record are what this
   * route always wrote. The job id derives from the idempotency scope, so a
   * retry that runs again (after a crash before the answer was stored)
   * enqueues the same job id, which the worker deduplicates.
   */
  @Post()
  @Idempotent()
  @HttpCode(HttpStatus.ACCEPTED)
  @ApiAcceptedResponse({
    type: JobAcceptedDto,
    description: 'Queued; Location names the job. A replay carries Idempotent-Replayed: true.',
  })
  @ApiProblemResponse(413, 'The body is over 1 MiB. Nothing was done.')
  async create(
    @Body() body: CreateSummaryDto,
    @Tenant() tenant: string,
    @IdempotencyContext() idempotency: IdempotencyRequestContext,
    @Res({ passthrough: true }) res: Response,
  ): Promise<JobAccepted> {
    const payload: SummaryJobPayload = { text: body.text, notify: body.notify };
    const { runId: jobId } = await this.summaries
      .start(payload, { tenant, idempotency })
      .catch(rethrowNotQueued('job'));
    res.location(`/v1/summaries/${jobId}`);
    return { job_id: jobId, status: 'queued' };
  }

  /** queued, done with the summary, or failed with the reason; 404 for any job that is not the tenant's. */
  @Get(':jobId')
  @ApiOkResponse({ type: SummaryStatusDto })
  @ApiProblemResponse(404, 'No such job for this tenant')
  read(@Param('jobId') jobId: string, @Tenant() tenant: string): Promise<SummaryStatus> {
    return this.status.find(jobId, tenant);
  }
}
