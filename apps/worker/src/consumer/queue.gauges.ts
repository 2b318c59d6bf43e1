import { Inject, Injectable } from '@nestjs/common';
import { InjectRedis } from '@app/redis';
import type { Redis } from 'ioredis';
import { Gauge, Registry } from 'prom-client';
import { STREAMS_CONSUMER_OPTIONS, type StreamsConsumerOptions } from './streams-consumer.options';

/** Queue depth, read from Redis at scrape time: what to alert on when it only grows. */
@Injectable()
export class QueueGauges {
  constructor(
    registry: Registry,
    @InjectRedis() redis: Redis,
    @Inject(STREAMS_CONSUMER_OPTIONS) options: StreamsConsumerOptions,
  ) {
    const { stream, group, deadLetterStream } = options;
    new Gauge({
      name: 'jobs_stream_length',
      help: 'Entries in the job stream: not yet acknowledged (acked entries are deleted)',
      registers: [registry],
      async collect() {
        this.set(await redis.xlen(stream).catch(() => NaN));
      },
    });
    new Gauge({
      name: 'jobs_stream_pending',
      help: 'Entries delivered to a consumer and not yet acknowledged',
      registers: [registry],
      async collect() {
        const summary = (await redis.xpending(stream, group).catch(() => null)) as [number, ...unknown[]] | null;
        this.set(summary ? Number(summary[0]) : NaN);
      },
    });
    new Gauge({
      name: 'jobs_dead_letter_length',
      help: 'Entries in the dead-letter stream',
      registers: [registry],
      async collect() {
        this.set(await redis.xlen(deadLetterStream).catch(() => NaN));
      },
    });
  }
}
