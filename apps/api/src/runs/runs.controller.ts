import { Controller, Get, NotFoundException, Param, UseGuards } from '@nestjs/common';
import { ApiBearerAuth, ApiOkResponse, ApiParam, ApiTags } from '@nestjs/swagger';
import { ApiProblemResponse, serviceUnavailable } from '@app/problem';
import { RunStateUnavailableError, type RunSnapshot, WorkflowClient } from '@app/workflows';
import { ApiKeyGuard } from '../auth/api-key.guard';
import { Tenant } from '../auth/principal';
import { TENANT_KEY_AUTH } from '../openapi';
import { RunStatusDto } from './run-responses.dto';

@ApiTags('runs')
@ApiBearerAuth(TENANT_KEY_AUTH)
@ApiProblemResponse(401, 'No or unknown API key')
@Controller('v1/runs')
@UseGuards(ApiKeyGuard)
export class RunsController {
  constructor(private readonly workflows: WorkflowClient) {}

  /**
   * Any workflow's run, summaries jobs included: queued, running, done with
   * its output, or failed with the reason; 404 for any run that is not the tenant's.
   */
  @Get(':runId')
  @ApiParam({ name: 'runId', format: 'uuid', description: "The run's id (a summaries job's id is its run id)" })
  @ApiOkResponse({ type: RunStatusDto })
  @ApiProblemResponse(404, 'No such run for this tenant')
  @ApiProblemResponse(503, 'Where the run stands cannot be read right now; retry')
  async read(@Param('runId') runId: string, @Tenant() tenant: string): Promise<RunSnapshot> {
    let run: RunSnapshot | undefined;
    try {
      run = await this.workflows.find(runId, tenant);
    } catch (err) {
      if (err instanceof RunStateUnavailableError) throw serviceUnavailable('The run status cannot be read right now');
      throw err;
    }
    if (!run) throw new NotFoundException('No such run.');
    return run;
  }
}
