'use strict';
/*
 * Preloaded (`node -r`) into a bench server by the api-profile part: a V8
 * CPU profile of exactly the load window, started on SIGUSR1 and written on
 * SIGUSR2 to $BENCH_PROFILE_OUT, so that neither the boot nor the warm-up is
 * in it. Sampled every 100 µs (V8's default, 1 ms, is too coarse for a
 * request of ~100 µs). The main thread only: /proc's CPU counts every thread.
 */
const inspector = require('node:inspector');
const { writeFileSync } = require('node:fs');

const session = new inspector.Session();
session.connect();
session.post('Profiler.enable');
session.post('Profiler.setSamplingInterval', { interval: 100 });
process.on('SIGUSR1', () => session.post('Profiler.start'));
process.on('SIGUSR2', () =>
  session.post('Profiler.stop', (err, result) => {
    if (err) process.stderr.write(`profile: ${err.message}\n`);
    else writeFileSync(process.env.BENCH_PROFILE_OUT, JSON.stringify(result.profile));
    process.stderr.write('profile written\n');
  }),
);
