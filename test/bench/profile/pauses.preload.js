'use strict';
/*
 * Preloaded (NODE_OPTIONS=--require) into every process of the e2e chain when
 * BENCH_PAUSES=1 (e2e-chain.ts): what held each process's event loop up, as a
 * record the bench cuts to each window. Every 250 ms it appends, as JSON
 * lines to $BENCH_PAUSES_DIR/<pid>.jsonl, the longest event-loop delay of
 * that quarter second (monitorEventLoopDelay, 2 ms resolution) and the GC
 * pauses since the last append, each at its wall-clock ms (Date). Appending a
 * few lines keeps the watching cheap next to what it watches.
 */
const { PerformanceObserver, monitorEventLoopDelay } = require('node:perf_hooks');
const { appendFileSync } = require('node:fs');
const { basename, join } = require('node:path');

const dir = process.env.BENCH_PAUSES_DIR;
if (dir) {
  const file = join(dir, `${process.pid}.jsonl`);
  const name = process.env.BENCH_PAUSES_NAME || basename(process.argv[1] ?? 'node');
  appendFileSync(file, `${JSON.stringify({ name })}\n`);
  const origin = performance.timeOrigin;
  let gc = [];
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) gc.push([Math.round(origin + e.startTime), +e.duration.toFixed(2)]);
  }).observe({ entryTypes: ['gc'] });
  const delay = monitorEventLoopDelay({ resolution: 2 });
  delay.enable();
  setInterval(() => {
    const line = { t: Date.now(), loop: +(delay.max / 1e6).toFixed(2), gc };
    delay.reset();
    gc = [];
    appendFileSync(file, `${JSON.stringify(line)}\n`);
  }, 250).unref();
}
