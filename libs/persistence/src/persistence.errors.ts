/** A write that must share a transaction with another was called outside one. */
export class TransactionRequiredError extends Error {
  constructor(what: string) {
    super(`${what} must run inside a transaction (pass the transaction's EntityManager)`);
    this.name = 'TransactionRequiredError';
  }
}
