import { Logger } from '@nestjs/common';
import type { NotificationSender, OutboxMessage } from './notification-sender.interface';

/**
 * The quick start's sender (NOTIFY_WEBHOOK_URL unset): logs that a
 * notification would go out, and succeeds. The recipient's address stays out
 * of the log; the job id is enough to find it.
 */
export class LogSender implements NotificationSender {
  private readonly logger = new Logger('LogSender');

  async send(message: OutboxMessage): Promise<void> {
    const jobId = typeof message.payload.job_id === 'string' ? message.payload.job_id : undefined;
    this.logger.log(
      `notification ${message.topic} dedupe_key=${message.dedupeKey}${jobId ? ` job_id=${jobId}` : ''} (log sender: not sent anywhere)`,
    );
  }
}
