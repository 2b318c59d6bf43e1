import { DynamicModule, Module } from '@nestjs/common';
import { FakePaymentsProvider, HttpPaymentsProvider, PaymentsProvider } from '@app/payments';
import { RefundMetrics } from './refund-metrics';
import { RefundRecovery } from './refund-recovery';
import { RefundsController } from './refunds.controller';
import { REFUNDS_OPTIONS, type RefundsOptions } from './refunds.options';
import { RefundsService } from './refunds.service';

/** POST /v1/refunds and GET /v1/refunds/<id>, paying through PAYMENTS_URL (unset: the built-in fake provider). */
@Module({})
export class RefundsModule {
  static forRoot(options: RefundsOptions): DynamicModule {
    return {
      module: RefundsModule,
      controllers: [RefundsController],
      providers: [
        { provide: REFUNDS_OPTIONS, useValue: options },
        {
          provide: PaymentsProvider,
          useFactory: (): PaymentsProvider =>
            options.paymentsUrl === undefined
              ? new FakePaymentsProvider()
              : new HttpPaymentsProvider({ baseUrl: options.paymentsUrl, timeoutMs: options.paymentsTimeoutMs }),
        },
        RefundsService,
        RefundRecovery,
        RefundMetrics,
      ],
    };
  }
}
