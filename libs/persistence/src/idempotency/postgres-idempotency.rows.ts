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
  /** The body as text, where text could hold it. */
  body: string | null;
  /** The body as bytes, where text could not (pg hands bytea over as a Buffer). */
  body_bytes: Buffer | null;
  streamed: boolean;
  running_for_ms: number;
  expires_in_ms: number;
}

/** What IdempotencySql.read returns. */
export interface FrameRow {
  seq: number;
  kind: 'head' | 'frame' | 'end';
  /** As text: a head's JSON, an end's outcome, a frame that text could hold. */
  data: string | null;
  /** A frame that text could not hold, as bytes. */
  data_bytes: Buffer | null;
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
    body: bytesOfColumns(row.body, row.body_bytes),
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
      return { kind: 'head', head: JSON.parse(row.data ?? '{}') as StoredHead };
    case 'frame':
      return { kind: 'frame', data: bytesOfColumns(row.data, row.data_bytes) };
    case 'end':
      return { kind: 'end', outcome: row.data === 'completed' ? 'completed' : 'aborted' };
  }
}

/**
 * Text first: an instance of the previous version that took a row over writes only the text, and bytes left
 * from the row's earlier answer must not win over it.
 */
function bytesOfColumns(text: string | null, bytes: Buffer | null): Buffer {
  if (text !== null) return Buffer.from(text, 'utf8');
  return bytes ?? Buffer.alloc(0);
}
