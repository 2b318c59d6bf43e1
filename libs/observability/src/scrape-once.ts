/**
 * For gauges read from a database at scrape time: prom-client collects every
 * metric of a scrape at once, so the gauges that share one query share one
 * call of `fetch` too. A failed fetch keeps the last values (the gauges say
 * what was last known rather than break the scrape) and reports the error.
 */
export function scrapeOnce<T>(fetch: () => Promise<T>, initial: T, onError: (err: unknown) => void): () => Promise<T> {
  let pending: Promise<T> | undefined;
  let last = initial;
  return () =>
    (pending ??= fetch()
      .then((value) => (last = value))
      .catch((err: unknown) => {
        onError(err);
        return last;
      })
      .finally(() => (pending = undefined)));
}
