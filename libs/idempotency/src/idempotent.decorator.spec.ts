import 'reflect-metadata';
import { Idempotent } from './idempotent.decorator';

describe('@Idempotent() options', () => {
  const decorate = (options: object) => () => {
    class OrdersController {
      refund(): void {}
    }
    const descriptor = Object.getOwnPropertyDescriptor(OrdersController.prototype, 'refund')!;
    Idempotent(options)(OrdersController.prototype, 'refund', descriptor);
  };

  it.each([
    ['lockTtlMs', 1.5],
    ['lockTtlMs', 0],
    ['lockTtlMs', Number.NaN],
    ['resultTtlMs', -1000],
    ['resultTtlMs', Number.POSITIVE_INFINITY],
    ['maxStoredBodyBytes', '1024'],
  ])('refuses %s %p when applied, naming the method and the option', (name, value) => {
    expect(decorate({ [name]: value })).toThrow(
      new RegExp(`OrdersController\\.refund: ${name} must be a positive whole number`),
    );
  });

  it('refuses a lock TTL longer than a timer can wait, and accepts every positive whole number up to it', () => {
    expect(decorate({ lockTtlMs: 2 ** 31 })).toThrow(/lockTtlMs must be at most/);
    expect(decorate({ lockTtlMs: 2 ** 31 - 1 })).not.toThrow();
    expect(
      decorate({ lockTtlMs: 1, resultTtlMs: 86_400_000, maxStoredBodyBytes: 1024, required: false }),
    ).not.toThrow();
    expect(decorate({})).not.toThrow();
  });

  it('refuses a required that is not a boolean', () => {
    expect(decorate({ required: 'yes' })).toThrow(/required must be true or false/);
  });

  it('refuses an acceptsRunScope that is not a boolean', () => {
    expect(decorate({ acceptsRunScope: 'yes' })).toThrow(/acceptsRunScope must be true or false/);
    expect(decorate({ acceptsRunScope: true })).not.toThrow();
  });

  it('refuses bad options on a class, naming it', () => {
    expect(() => {
      @Idempotent({ resultTtlMs: 0.5 })
      class RefundsController {}
      return RefundsController;
    }).toThrow(/on RefundsController: resultTtlMs/);
  });
});
