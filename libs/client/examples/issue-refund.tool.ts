/*
 * An `issue_refund` tool for an LLM support agent, on @app/client.
 *
 *   const client = new ApiClient({ baseUrl: 'https://api.example.com', apiKey, deadlineMs: 30_000 });
 *   const tools = { issue_refund: createIssueRefundTool(client, { ticketId: ticket.id, currency: 'EUR' }) };
 *   // the agent calls tools.issue_refund(ticketId, orderId, amount) and reads `message` back.
 *
 * Why the key is not random: when the agent's turn is re-run (the model
 * called the tool again, the worker restarted, the conversation was replayed),
 * the same ticket and order must name the same refund, or the customer is paid
 * twice. `issueRefund` builds the key from those facts, so every re-run, and
 * every retry inside the client, sends the same key.
 */
import { type ApiClient, type ApiResult, issueRefund as postRefund, type Refund } from '@app/client';

/** What the tool hands back to the model. */
export type RefundToolReply =
  | { readonly status: 'refunded'; readonly refund_id: string; readonly payout_id: string; readonly message: string }
  | { readonly status: 'refused'; readonly reason: string; readonly message: string }
  | { readonly status: 'pending'; readonly message: string };

/** The tool's description for the model (OpenAI function-calling shape). */
export const issueRefundToolSchema = {
  type: 'function',
  function: {
    name: 'issue_refund',
    description:
      'Refund an order for the customer of this ticket. Calling it again for the same ticket and order never pays twice.',
    parameters: {
      type: 'object',
      additionalProperties: false,
      required: ['ticketId', 'orderId', 'amount'],
      properties: {
        ticketId: { type: 'string', description: 'The support ticket id.' },
        orderId: { type: 'string', description: 'The order to refund.' },
        amount: { type: 'integer', minimum: 1, description: 'The amount in minor units (cents).' },
      },
    },
  },
} as const;

export interface IssueRefundToolOptions {
  readonly currency: string;
}

/** The tool function: `issueRefund(ticketId, orderId, amount)`. */
export function createIssueRefundTool(
  client: ApiClient,
  options: IssueRefundToolOptions,
): (ticketId: string, orderId: string, amount: number) => Promise<RefundToolReply> {
  return async function issueRefund(ticketId, orderId, amount) {
    const result = await postRefund(client, {
      ticket_id: ticketId,
      order_id: orderId,
      amount,
      currency: options.currency,
    });
    return refundToolReply(result);
  };
}

/** The three outcomes, in words the agent can pass on. */
export function refundToolReply(result: ApiResult<Refund>): RefundToolReply {
  switch (result.outcome) {
    case 'succeeded':
      return {
        status: 'refunded',
        refund_id: result.body.refund_id,
        payout_id: result.body.payout_id,
        message:
          `The refund of ${formatAmount(result.body.amount, result.body.currency)} for order ${result.body.order_id} ` +
          `has been paid (refund ${result.body.refund_id}). Tell the customer it is done.`,
      };
    case 'rejected':
      return {
        status: 'refused',
        reason: result.problem.detail ?? result.problem.title ?? result.problem.type,
        message:
          `The refund was refused and nothing was paid: ${result.problem.detail ?? result.problem.title ?? `status ${result.status}`}. ` +
          'Tell the customer it could not be done, and why; do not try again with other values unless the customer asks.',
      };
    case 'unknown':
      // Not a failure: the payment may already be on its way.
      return {
        status: 'pending',
        message:
          'The refund is still being processed; its outcome is not known yet. Tell the customer it is being processed ' +
          'and they will be notified. Do not tell them it failed, and do not retry with a new request: calling this tool ' +
          'again later with the same ticket and order is safe and returns the same refund.',
      };
  }
}

function formatAmount(minor: number, currency: string): string {
  return `${(minor / 100).toFixed(2)} ${currency}`;
}
