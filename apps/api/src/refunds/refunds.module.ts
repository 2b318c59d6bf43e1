import { DynamicModule, Logger, Module } from '@nestjs/common';
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
          useFactory: (): PaymentsProvider => {
            if (options.paymentsUrl !== undefined)
              return new HttpPaymentsProvider({ baseUrl: options.paymentsUrl, timeoutMs: options.paymentsTimeoutMs });
            if (options.production) {
              // Allowed (the compose quick start runs production), but it pays nothing, and each replica knows only its
              // own payouts.
              new Logger(RefundsModule.name).warn(
                "PAYMENTS_URL is unset: POST /v1/refunds pays through the built-in fake provider, in this process's memory. No money moves; set PAYMENTS_URL wherever refunds are real.",
              );
            }
            return new FakePaymentsProvider();
          },
        },
        RefundsService,
        RefundRecovery,
        RefundMetrics,
      ],
    };
  }
}
