import type { LoggerService } from '@nestjs/common';

export interface ProcessWarnings {
  /** From now on warnings go to `logger`, the ones raised before first. */
  logTo(logger: LoggerService): void;
}

/**
 * Node prints process warnings (MaxListenersExceededWarning, a dependency's
 * DeprecationWarning) to stderr as plain text, which breaks a log pipeline
 * that expects one JSON object per line. Node's own printer is removed and
 * the warnings go through the app's logger, as warnings. Taken over before
 * the app is built (Node emits a warning on the next tick, so even those
 * raised while main.ts's imports load arrive here) and held until the
 * logger exists.
 */
export function captureProcessWarnings(): ProcessWarnings {
  for (const listener of process.listeners('warning')) process.removeListener('warning', listener);
  let held: (Error & { code?: string })[] = [];
  let log: ((warning: Error & { code?: string }) => void) | undefined;
  process.on('warning', (warning: Error & { code?: string }) => {
    if (log) log(warning);
    else held.push(warning);
  });
  return {
    logTo(logger) {
      log = (warning) => {
        logger.warn({ warning: warning.name, code: warning.code }, warning.message);
      };
      for (const warning of held) log(warning);
      held = [];
    },
  };
}
