import type { LoggerService } from '@nestjs/common';

/**
 * Node prints process warnings (MaxListenersExceededWarning, a dependency's
 * DeprecationWarning) to stderr as plain text, which breaks a log pipeline
 * that expects one JSON object per line. They go through the app's logger
 * instead, as warnings; Node's own printer is removed.
 */
export function logProcessWarnings(logger: LoggerService): void {
  for (const listener of process.listeners('warning')) process.removeListener('warning', listener);
  process.on('warning', (warning: Error & { code?: string }) => {
    logger.warn({ warning: warning.name, code: warning.code }, warning.message);
  });
}
