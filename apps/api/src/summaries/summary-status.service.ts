import { Injectable, NotFoundException } from '@nestjs/common';
import { isUuid } from '@app/ids';
import { SummaryJobQueue } from '@app/summary-queue';
import { SummaryRepository } from '@app/persistence';
import { ProblemException, serviceUnavailable } from '@app/problem';
import { DataSource } from 'typeorm';

export type SummaryStatus =
  | { readonly job_id: string; readonly status: 'queued' }
  | { readonly job_id: string; readonly status: 'done'; readonly summary: string }
  | { readonly job_id: string; readonly status: 'failed'; readonly error: string };

/**
 * Where a job stands, for its own tenant only: done when its summary is in
 * PostgreSQL, failed when the worker dead-lettered it, queued while its job
 * record says it was accepted. Anything else, another tenant's job included,
 * is not found: ids do not leak across tenants.
 */
@Injectable()
export class SummaryStatusService {
  constructor(
    private readonly dataSource: DataSource,
    private readonly summaries: SummaryRepository,
    private readonly queue: SummaryJobQueue,
  ) {}

  async find(jobId: string, tenant: string): Promise<SummaryStatus> {
    if (!isUuid(jobId)) throw notFound();
    const lowered = jobId.toLowerCase();
    // Both at once: a queued job (the common poll) costs one round trip of
    // latency, not two. A stored summary is the answer whatever Redis says,
    // so a finished job still reads as done while Redis is down.
    const [stored, record] = await Promise.allSettled([
      this.summaries.findForTenant(this.dataSource.manager, lowered, tenant),
      this.queue.findRecord(lowered),
    ]);
    if (stored.status === 'fulfilled' && stored.value)
      return { job_id: lowered, status: 'done', summary: stored.value.summary };
    if (stored.status === 'rejected' || record.status === 'rejected') throw unavailable();
    if (record.value?.tenant === tenant) {
      return record.value.status === 'failed'
        ? { job_id: lowered, status: 'failed', error: record.value.error ?? 'failed' }
        : { job_id: lowered, status: 'queued' };
    }
    throw notFound();
  }
}

function unavailable(): ProblemException {
  return serviceUnavailable('The job status cannot be read right now');
}

function notFound(): NotFoundException {
  return new NotFoundException('No such job.');
}
