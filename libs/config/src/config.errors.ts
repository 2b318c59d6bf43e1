export interface ConfigProblem {
  readonly variable: string;
  readonly message: string;
}

/** Thrown once at boot with every bad variable, so an operator fixes them all in one go. */
export class ConfigValidationError extends Error {
  constructor(readonly problems: readonly ConfigProblem[]) {
    super(`Invalid configuration: ${problems.map((p) => `${p.variable} ${p.message}`).join('; ')}`);
    this.name = 'ConfigValidationError';
  }
}

/** Raised by a field parser; parseConfig attaches the variable name. */
export class ConfigFieldError extends Error {}
