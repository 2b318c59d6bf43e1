import type { ClaimResult, FrameEvent, FramesRef, StoredHead, StoredResponse } from '@app/idempotency';

/** What IdempotencySql.claim returns. */
export interface ClaimRow {
  claimed: boolean;
  /** With `claimed`: the row it took was a running request's whose lock had expired. */
  took_over_running?: boolean;
  state: 'running' | 'completed';
  fingerprint: string;
  attempt: string;
  status: number | null;
  headers: Record<string, string> | null;
  /** The body as bytes (body_bytes, or body's UTF-8): pg hands bytea over as a Buffer. */
  body: Buffer | null;
  streamed: boolean;
  running_for_ms: number;
  expires_in_ms: number;
}

/** What IdempotencySql.read returns. */
export interface FrameRow {
  seq: number;
  kind: 'head' | 'frame' | 'end';
  /** As bytes: a frame's; a head's JSON and an end's outcome as their UTF-8. */
  data: Buffer | null;
}

/** What a claim found, as the contract says it (pure: the row is the only fact). */
export function claimResultOf(row: ClaimRow, key: string): ClaimResult {
  if (row.claimed) return row.took_over_running ? { outcome: 'claimed', tookOver: true } : { outcome: 'claimed' };
  if (row.state === 'completed') {
    return { outcome: 'completed', fingerprint: row.fingerprint, response: storedResponseOf(row, key) };
  }
  return {
    outcome: 'in-progress',
    fingerprint: row.fingerprint,
    runningForMs: row.running_for_ms,
    expiresInMs: row.expires_in_ms,
    frames: framesRef(row.attempt, key),
  };
}

/** A completed row's answer; a streamed one names its frame log. */
export function storedResponseOf(row: ClaimRow, key: string): StoredResponse {
  return {
    status: Number(row.status),
    headers: row.headers ?? {},
    body: row.body ?? Buffer.alloc(0),
    ...(row.streamed ? { frames: framesRef(row.attempt, key) } : {}),
  };
}

/** A frames ref names the attempt and its key (so the liveness check reads the key row by its primary key). */
export function framesRef(attempt: string, key: string): FramesRef {
  return `${attempt}:${key}` as FramesRef;
}

export function parseRef(ref: FramesRef): { attempt: string; key: string } {
  const attempt = ref.slice(0, 36);
  if (ref[36] !== ':' || !/^[0-9a-f-]{36}$/.test(attempt)) throw new Error('not a frames reference of this store');
  return { attempt, key: ref.slice(37) };
}

/** One entry of a frame log as its follower gets it. */
export function frameEventOf(row: FrameRow): FrameEvent {
  switch (row.kind) {
    case 'head':
      return { kind: 'head', head: JSON.parse(row.data?.toString('utf8') ?? '{}') as StoredHead };
    case 'frame':
      return { kind: 'frame', data: row.data ?? Buffer.alloc(0) };
    case 'end':
      return { kind: 'end', outcome: row.data?.toString('utf8') === 'completed' ? 'completed' : 'aborted' };
  }
}
