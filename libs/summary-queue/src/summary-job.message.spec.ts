import { MalformedSummaryJobError, parseSummaryJob } from './summary-job.message';

const JOB_ID = '2ed6657d-e927-568b-95e1-2665a8aea6a2';
const entry = (fields: Record<string, string>) => ({ id: '1-0', fields });

describe('parseSummaryJob', () => {
  it('reads the job an enqueued entry carries', () => {
    const payload = JSON.stringify({ text: 'some text', notify: 'ops@example.com', extra: 1 });
    expect(parseSummaryJob(entry({ job_id: JOB_ID, tenant: 'tenant-a', payload }))).toEqual({
      jobId: JOB_ID,
      tenant: 'tenant-a',
      payload: { text: 'some text', notify: 'ops@example.com' },
    });
  });

  it.each([
    ['no job_id', { tenant: 't', payload: '{"text":"x","notify":"y"}' }, 'job_id is missing or not a UUID'],
    ['a job_id that is not a UUID', { job_id: 'not-a-uuid', tenant: 't' }, 'job_id is missing or not a UUID'],
    ['no tenant', { job_id: JOB_ID, payload: '{"text":"x","notify":"y"}' }, 'tenant is missing'],
    ['no payload', { job_id: JOB_ID, tenant: 't' }, 'payload is not JSON'],
    ['a payload that is not JSON', { job_id: JOB_ID, tenant: 't', payload: '{' }, 'payload is not JSON'],
    ['a null payload', { job_id: JOB_ID, tenant: 't', payload: 'null' }, 'payload needs text and notify'],
    [
      'an empty text',
      { job_id: JOB_ID, tenant: 't', payload: '{"text":"","notify":"y"}' },
      'payload needs text and notify',
    ],
    ['no notify', { job_id: JOB_ID, tenant: 't', payload: '{"text":"x"}' }, 'payload needs text and notify'],
  ])('refuses an entry with %s', (_, fields, message) => {
    const parse = () => parseSummaryJob(entry(fields));
    expect(parse).toThrow(MalformedSummaryJobError);
    expect(parse).toThrow(message);
  });
});
