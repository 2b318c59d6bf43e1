import { Body, Controller, HttpCode, HttpStatus, Post, Res, UseGuards } from '@nestjs/common';
import { ApiAcceptedResponse, ApiBearerAuth, ApiTags } from '@nestjs/swagger';
import { IdempotencyContext, Idempotent, type IdempotencyRequestContext } from '@app/idempotency';
import { ApiProblemResponse, serviceUnavailable } from '@app/problem';
import { NotReplicatedError } from '@app/redis';
import { UnregisteredWorkflowError, WorkflowClient } from '@app/workflows';
import type { Response } from 'express';
import { ApiKeyGuard } from '../auth/api-key.guard';
import { Tenant } from '../auth/principal';
import { TENANT_KEY_AUTH } from '../openapi';
import { RunAcceptedDto } from '../runs/run-responses.dto';
import { CreateTriageDto } from './create-triage.dto';

export interface RunAccepted {
  readonly run_id: string;
  readonly status: 'queued';
}

/** The example workflow's route: the template for starting any workflow (docs/workflows.md). */
@ApiTags('triage')
@ApiBearerAuth(TENANT_KEY_AUTH)
@ApiProblemResponse(401, 'No or unknown API key')
@Controller('v1/triage')
@UseGuards(ApiKeyGuard)
export class TriageController {
  constructor(private readonly workflows: WorkflowClient) {}

  /**
   * Starts a triage run (classify, draft, notify). The run id derives from
   * the idempotency scope, so a retry that runs again (after a crash before
   * the answer was stored) starts the same run, whose steps commit once.
   */
  @Post()
  @Idempotent()
  @HttpCode(HttpStatus.ACCEPTED)
  @ApiAcceptedResponse({
    type: RunAcceptedDto,
    description: 'Queued; Location names the run. A replay carries Idempotent-Replayed: true.',
  })
  @ApiProblemResponse(413, 'The body is over 1 MiB. Nothing was done.')
  async create(
    @Body() body: CreateTriageDto,
    @Tenant() tenant: string,
    @IdempotencyContext() idempotency: IdempotencyRequestContext,
    @Res({ passthrough: true }) res: Response,
  ): Promise<RunAccepted> {
    const input = { ticket_id: body.ticket_id, text: body.text, notify: body.notify };
    let runId: string;
    try {
      ({ runId } = await this.workflows.start('triage', input, { tenant, key: idempotency.operation }));
    } catch (err) {
      if (err instanceof UnregisteredWorkflowError) throw err; // ApiModule's registration is missing: a bug, not Redis
      // Written on a master that no replica confirmed in time: not acknowledged, since losing that master would
      // lose the run. A retry starts the same run id, which runs once.
      if (err instanceof NotReplicatedError)
        throw serviceUnavailable(
          'The run could not be queued durably',
          'No replica of the workflow queue confirmed the run in time. Retry with the same Idempotency-Key; the ' +
            'run happens once however often it was queued.',
        );
      throw serviceUnavailable(
        'The run could not be queued',
        'The workflow queue is unreachable; nothing was queued. Retry with the same Idempotency-Key.',
      );
    }
    res.location(`/v1/runs/${runId}`);
    return { run_id: runId, status: 'queued' };
  }
}
