import { OperatedQueues, type OtherQueue } from '@app/workflows';
import { CONSUMER_GROUP } from './summary-job';
import { SINGLE_STREAM, STREAM_TAG_PREFIX, type SummaryStreams } from './summary-streams';

/**
 * The queues the admin tools cover, summaries first (its names are this
 * lib's): the one workflow of its own queue is `summaries`.
 */
export function operatedQueues(
  streams: SummaryStreams = SINGLE_STREAM,
  others?: readonly OtherQueue[],
): OperatedQueues {
  return new OperatedQueues(
    { name: STREAM_TAG_PREFIX, layout: streams, group: CONSUMER_GROUP, workflow: STREAM_TAG_PREFIX },
    others,
  );
}
