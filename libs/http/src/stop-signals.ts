import type { LoggerService } from '@nestjs/common';
import { constants } from 'node:os';

/** What the n-th stop signal (SIGTERM or SIGINT, either, counted together; 1 the first) does. */
export type StopSignalAction = 'drain' | 'ignore' | 'exit';

/**
 * The first signal drains (Nest's shutdown hook runs the modules' hooks, then
 * exits 0). The second is ignored: Ctrl-C under `npm start` comes twice, from
 * the terminal and from concurrently, which forwards it, and the repeat must
 * not kill the app mid-drain. The third (a second Ctrl-C, an operator's second
 * `kill`) ends the process at once, for a drain that hangs (a webhook or a
 * model that never answers): without it only SIGKILL would.
 */
export function stopSignalAction(n: number): StopSignalAction {
  if (n <= 1) return 'drain';
  return n === 2 ? 'ignore' : 'exit';
}

/** The exit status of a process ended by `signal`, as a shell reports it: 130 for SIGINT, 143 for SIGTERM. */
export const signalExitCode = (signal: NodeJS.Signals): number => 128 + constants.signals[signal];

/**
 * Called once the app's own shutdown hooks are registered (enableShutdownHooks),
 * so that on the first signal they run first. Until a signal comes, only a
 * listener that waits for it is installed: the process's signals behave as
 * Nest leaves them. From the first signal on, the repeats are counted
 * (stopSignalAction) by a listener that stays until the exit: Nest lets go of
 * its own handlers once the app is closed, a moment before it calls
 * process.exit(0), and a repeat in that moment would otherwise kill the process
 * by the signal's default action (`exited with code SIGINT`, npm start 130).
 */
export function handleStopSignals(
  signals: readonly NodeJS.Signals[],
  logger: LoggerService,
  exit: (code: number) => void = (code) => process.exit(code),
): void {
  let received = 0;
  const onSignal = (signal: NodeJS.Signals): void => {
    received++;
    const action = stopSignalAction(received);
    if (action === 'drain') {
      for (const s of signals) {
        process.removeListener(s, first);
        process.on(s, onSignal);
      }
      logger.log(`${signal}: stopping once the work in progress is done; a third signal stops at once`);
    } else if (action === 'ignore') {
      logger.warn(`${signal} again: still stopping; one more stops at once, the work in progress unfinished`);
    } else {
      logger.error(`${signal} a third time: exiting now, the work in progress unfinished`);
      exit(signalExitCode(signal));
    }
  };
  const first = (signal: NodeJS.Signals): void => onSignal(signal);
  for (const s of signals) process.on(s, first);
}
