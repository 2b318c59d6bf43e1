import type { LoggerService } from '@nestjs/common';
import { handleStopSignals, signalExitCode, stopSignalAction } from './stop-signals';

describe('stop signals', () => {
  it.each([
    [1, 'drain'],
    [2, 'ignore'],
    [3, 'exit'],
    [4, 'exit'],
  ])('the signal number %d: %s', (n, action) => {
    expect(stopSignalAction(n)).toBe(action);
  });

  it('exits as a shell reports a process ended by the signal', () => {
    expect(signalExitCode('SIGINT')).toBe(130);
    expect(signalExitCode('SIGTERM')).toBe(143);
  });

  describe('handleStopSignals (signals emitted on this process, not sent)', () => {
    const SIGNALS: NodeJS.Signals[] = ['SIGTERM', 'SIGINT'];
    let before: Map<NodeJS.Signals, NodeJS.SignalsListener[]>;
    const logged: string[] = [];
    const logger: LoggerService = {
      log: (m: string) => logged.push(`log ${m}`),
      warn: (m: string) => logged.push(`warn ${m}`),
      error: (m: string) => logged.push(`error ${m}`),
    };
    const added = (signal: NodeJS.Signals) =>
      process.listeners(signal).filter((l) => !before.get(signal)!.includes(l)).length;

    beforeEach(() => {
      logged.length = 0;
      before = new Map(SIGNALS.map((s) => [s, process.listeners(s)]));
    });
    afterEach(() => {
      for (const s of SIGNALS)
        for (const l of process.listeners(s)) if (!before.get(s)!.includes(l)) process.removeListener(s, l);
    });

    it('waits with one listener a signal; from the first on, counts them, either signal; the third exits', () => {
      const exits: number[] = [];
      handleStopSignals(SIGNALS, logger, (code) => exits.push(code));
      expect(SIGNALS.map(added)).toEqual([1, 1]);

      process.emit('SIGTERM', 'SIGTERM');
      process.emit('SIGINT', 'SIGINT');
      expect(exits).toEqual([]);
      // Still one listener each, kept until the exit: a repeat never meets a process without one.
      expect(SIGNALS.map(added)).toEqual([1, 1]);
      process.emit('SIGINT', 'SIGINT');
      expect(exits).toEqual([130]);
      expect(logged.map((l) => l.split(':')[0])).toEqual([
        'log SIGTERM',
        'warn SIGINT again',
        'error SIGINT a third time',
      ]);
    });
  });
});
