import { ConfigValidationError } from './config.errors';
import type { Env } from './env-schema';

/** The variables a loader rejects for `env`, in schema order; [] when it accepts it. For config tests. */
export function configProblems(load: (env: Env) => unknown, env: Env): string[] {
  try {
    load(env);
    return [];
  } catch (err) {
    if (err instanceof ConfigValidationError) return err.problems.map((p) => p.variable);
    throw err;
  }
}
