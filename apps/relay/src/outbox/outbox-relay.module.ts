import { Inject, Module, type OnApplicationShutdown, type Provider } from '@nestjs/common';
import { LogSender } from './log.sender';
import { NotificationSender } from './notification-sender.interface';
import { OutboxListener } from './outbox-listener';
import {
  ConfigurableModuleClass,
  OUTBOX_RELAY_OPTIONS,
  type OutboxRelayOptions,
} from './outbox-relay.module-definition';
import { OutboxRelayMetrics } from './outbox-relay.metrics';
import { OutboxRelayRepository } from './outbox-relay.repository';
import { OutboxRelay } from './outbox.relay';
import { WebhookSender } from './webhook.sender';

const senderProvider: Provider = {
  provide: NotificationSender,
  inject: [OUTBOX_RELAY_OPTIONS],
  useFactory: (options: OutboxRelayOptions): NotificationSender =>
    options.webhookUrl ? new WebhookSender(options.webhookUrl) : new LogSender(),
};

/**
 * The outbox relay: OutboxRelay's loop, its LISTEN connection, its SQL and
 * the notification sender. Needs the global DataSource (PersistenceModule),
 * Registry (MetricsModule) and HealthChecksRegistry (HealthModule).
 */
@Module({
  providers: [senderProvider, OutboxListener, OutboxRelayRepository, OutboxRelayMetrics, OutboxRelay],
  exports: [OutboxRelay, OutboxListener],
})
export class OutboxRelayModule extends ConfigurableModuleClass implements OnApplicationShutdown {
  constructor(@Inject(NotificationSender) private readonly sender: NotificationSender) {
    super();
  }

  /** After the relay's drain (beforeApplicationShutdown): the webhook's kept-alive connections end. */
  onApplicationShutdown(): void {
    if (this.sender instanceof WebhookSender) this.sender.close();
  }
}
