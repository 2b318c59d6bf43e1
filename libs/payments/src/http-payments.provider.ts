import {
  isRefusal,
  PaymentOutcomeUnknownError,
  type Payout,
  payoutFrom,
  type PaymentsProvider,
  type PayoutRequest,
  type PayoutResult,
} from './payments-provider';

export interface HttpPaymentsProviderOptions {
  /** PAYMENTS_URL: the provider's root; `/payouts` is appended. */
  readonly baseUrl: string;
  /** The longest one call (answer and body) may take: PAYMENTS_TIMEOUT_S in milliseconds. */
  readonly timeoutMs: number;
}

/** A provider's answer, body read whole. */
interface Answer {
  readonly status: number;
  readonly text: string;
}

/** The body as JSON when it is JSON, else the text as it came (a refusal's body is kept either way). */
function parsedBody(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return text;
  }
}

/** What a payout's answer settles: paid, refused, or (thrown) nothing. */
export function payoutResultFrom(answer: Answer, reference: string): PayoutResult {
  const { status, text } = answer;
  if (status >= 200 && status < 300) {
    const payout = payoutFrom(parsedBody(text), reference);
    if (payout === undefined)
      throw new PaymentOutcomeUnknownError(
        'status',
        `the provider answered ${status} without a payout for this reference`,
        status,
      );
    return { outcome: 'paid', payout };
  }
  if (isRefusal(status)) return { outcome: 'refused', status, body: parsedBody(text) };
  throw new PaymentOutcomeUnknownError('status', `the provider answered ${status}`, status);
}

/** What a lookup's answer settles: the payout, none (404), or (thrown) nothing. */
export function lookupResultFrom(answer: Answer, reference: string): Payout | undefined {
  const { status, text } = answer;
  if (status === 404) return undefined;
  if (status === 200) {
    const payout = payoutFrom(parsedBody(text), reference);
    if (payout === undefined)
      throw new PaymentOutcomeUnknownError(
        'status',
        'the provider answered 200 without a payout for this reference',
        status,
      );
    return payout;
  }
  throw new PaymentOutcomeUnknownError('status', `the provider answered ${status} to a lookup`, status);
}

/**
 * The payment provider over HTTP (global fetch). Every call, body included,
 * runs under the caller's signal and its own deadline; a redirect is not
 * followed (a POST replayed elsewhere could pay twice), it settles nothing.
 */
export class HttpPaymentsProvider implements PaymentsProvider {
  private readonly payoutsUrl: string;
  private readonly timeoutMs: number;

  constructor(options: HttpPaymentsProviderOptions) {
    const url = new URL(options.baseUrl);
    if (url.protocol !== 'http:' && url.protocol !== 'https:')
      throw new Error(`the payment provider's URL must be http or https, got "${url.protocol}"`);
    if (!Number.isFinite(options.timeoutMs) || options.timeoutMs <= 0)
      throw new Error(`the payment provider's timeout must be a positive number of ms, got ${options.timeoutMs}`);
    url.pathname = `${url.pathname.replace(/\/+$/, '')}/payouts`;
    url.search = '';
    url.hash = '';
    this.payoutsUrl = url.href;
    this.timeoutMs = options.timeoutMs;
  }

  payout(request: PayoutRequest, signal: AbortSignal): Promise<PayoutResult> {
    const { reference, order_id, amount, currency } = request;
    const body = JSON.stringify({ reference, order_id, amount, currency });
    return this.call(signal, this.payoutsUrl, {
      method: 'POST',
      headers: { 'Idempotency-Key': reference, 'Content-Type': 'application/json', Accept: 'application/json' },
      body,
    }).then((answer) => payoutResultFrom(answer, reference));
  }

  lookup(reference: string, signal: AbortSignal): Promise<Payout | undefined> {
    const url = `${this.payoutsUrl}?reference=${encodeURIComponent(reference)}`;
    return this.call(signal, url, { method: 'GET', headers: { Accept: 'application/json' } }).then((answer) =>
      lookupResultFrom(answer, reference),
    );
  }

  /**
   * One request, answer and body, under `AbortSignal.any([signal, deadline])`.
   * The deadline is a timer cleared when the call ends: AbortSignal.timeout
   * would keep its signal (and what hangs on it) alive for the whole timeout
   * after every call.
   */
  private async call(signal: AbortSignal, url: string, init: RequestInit): Promise<Answer> {
    // Nothing sent yet: the caller's abort is the caller's, and no payout can exist.
    signal.throwIfAborted();
    const deadline = new AbortController();
    const timer = setTimeout(() => deadline.abort(), this.timeoutMs);
    try {
      const response = await fetch(url, {
        ...init,
        redirect: 'manual',
        signal: AbortSignal.any([signal, deadline.signal]),
      });
      return { status: response.status, text: await response.text() };
    } catch (err) {
      if (deadline.signal.aborted) {
        throw new PaymentOutcomeUnknownError(
          'timeout',
          `the payment provider did not answer within ${this.timeoutMs} ms`,
          undefined,
          { cause: err },
        );
      }
      if (signal.aborted) {
        // The caller gave up while the request was out: it may have reached the provider.
        throw new PaymentOutcomeUnknownError(
          'timeout',
          'the call to the payment provider was aborted before its answer',
          undefined,
          { cause: signal.reason },
        );
      }
      throw new PaymentOutcomeUnknownError(
        'connection',
        `the payment provider could not be reached: ${describe(err)}`,
        undefined,
        { cause: err },
      );
    } finally {
      clearTimeout(timer);
    }
  }
}

/**
 * fetch's "fetch failed" says little; its cause names the connection error
 * (ECONNREFUSED, ...). Read by shape: fetch's errors may come from another
 * realm (jest's vm), where `instanceof Error` is false.
 */
function describe(err: unknown): string {
  const { message, cause } = (err ?? {}) as { message?: unknown; cause?: { code?: unknown; message?: unknown } };
  const text = typeof message === 'string' ? message : String(err);
  const detail = cause?.code ?? cause?.message;
  return typeof detail === 'string' ? `${text} (${detail})` : text;
}
