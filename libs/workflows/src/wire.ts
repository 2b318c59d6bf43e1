import { isUuid } from '@app/ids';
import { TRACEPARENT } from '@app/tracing';

/**
 * The fields of a step entry on a queue's stream, written and read here and
 * nowhere else. `job_id` is the run id (the name summaries' entries have
 * always had); `payload` the run's input as JSON text, the same on every step
 * of a run; `workflow` only on a shared queue (absent: the queue's one
 * workflow); `step` absent on a run's first entry; `state` the outputs the
 * earlier steps committed, by step name (absent: `{}`). An entry written by
 * the api before workflows existed (`job_id`, `tenant`, `payload`) is a valid
 * first-step entry of summaries. `traceparent` (W3C) is the trace of what
 * queued the entry (the POST, the step before), when tracing is on: the
 * consumer's delivery span continues it.
 */
export const STEP_ENTRY_FIELDS = {
  runId: 'job_id',
  tenant: 'tenant',
  payload: 'payload',
  workflow: 'workflow',
  step: 'step',
  state: 'state',
  redriven: 'redriven',
  traceparent: TRACEPARENT,
} as const;

/** A step entry as the engine sees it. */
export interface StepEntry {
  readonly runId: string;
  readonly tenant: string;
  /** The run's input as written (JSON text): carried unchanged to every later step. */
  readonly payload: string;
  /** The run's input, parsed. */
  readonly input: unknown;
  readonly workflow?: string;
  readonly step?: string;
  /** What the earlier steps committed, by step name. */
  readonly state: Readonly<Record<string, unknown>>;
  /**
   * Put back by an operator's re-drive (`redriven`, the times it was, written by the re-drive script alone): the one
   * delivery that may set a failed run running again. Never carried to the next step's entry.
   */
  readonly redriven: boolean;
}

/** An entry that is not a step entry, and never will be: dead-lettered `malformed`, never retried. */
export class MalformedEntryError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** A JSON object (not an array, not null): what an input, a state and a mergeable output are. */
export function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** The step entry `fields` carry, or a MalformedEntryError naming what is wrong. */
export function parseStepEntry(fields: Readonly<Record<string, string>>): StepEntry {
  const f = STEP_ENTRY_FIELDS;
  const runId = fields[f.runId];
  const tenant = fields[f.tenant];
  const payload = fields[f.payload];
  if (!runId || !isUuid(runId)) throw new MalformedEntryError(`${f.runId} is missing or not a UUID`);
  if (!tenant) throw new MalformedEntryError(`${f.tenant} is missing`);
  let input: unknown;
  try {
    input = JSON.parse(payload ?? '');
  } catch {
    throw new MalformedEntryError(`${f.payload} is not JSON`);
  }
  const workflow = fields[f.workflow];
  const step = fields[f.step];
  if (workflow === '') throw new MalformedEntryError(`${f.workflow} is empty`);
  if (step === '') throw new MalformedEntryError(`${f.step} is empty`);
  let state: unknown = {};
  if (fields[f.state] !== undefined) {
    try {
      state = JSON.parse(fields[f.state]);
    } catch {
      throw new MalformedEntryError(`${f.state} is not JSON`);
    }
    if (!isPlainObject(state)) throw new MalformedEntryError(`${f.state} is not a JSON object`);
  }
  return {
    runId,
    tenant,
    payload,
    input,
    ...(workflow === undefined ? {} : { workflow }),
    ...(step === undefined ? {} : { step }),
    state: state as Record<string, unknown>,
    redriven: fields[f.redriven] !== undefined,
  };
}

/**
 * An entry's run id and `workflow` field only, without parsing its payload or
 * state: what a batch needs to group its entries by workflow. Undefined when
 * the run id is not one (its delivery dead-letters it).
 */
export function stepEntryRun(
  fields: Readonly<Record<string, string>>,
): { runId: string; workflow?: string } | undefined {
  const runId = fields[STEP_ENTRY_FIELDS.runId];
  if (!runId || !isUuid(runId)) return undefined;
  const workflow = fields[STEP_ENTRY_FIELDS.workflow];
  return workflow === undefined ? { runId } : { runId, workflow };
}

/**
 * The trace an entry continues (its `traceparent` field), read without parsing the rest: the consumer's delivery
 * span is its child, whatever the entry turns out to be. Undefined when it was queued with tracing off.
 */
export function stepEntryTraceparent(fields: Readonly<Record<string, string>>): string | undefined {
  return fields[STEP_ENTRY_FIELDS.traceparent];
}

/** A stream entry's flat field list as Redis returns it (`[k1, v1, k2, v2, ...]`), as the map the parsers take. */
export function entryFieldMap(flat: readonly string[]): Record<string, string> {
  const fields: Record<string, string> = {};
  for (let i = 0; i + 1 < flat.length; i += 2) fields[flat[i]] = flat[i + 1];
  return fields;
}

/** What a step entry is written from: `workflow` only on a shared queue; `step`, `state` only after the first step. */
export interface NewStepEntry {
  readonly runId: string;
  readonly tenant: string;
  readonly payload: string;
  readonly workflow?: string;
  readonly step?: string;
  readonly state?: Readonly<Record<string, unknown>>;
  /** The trace the entry continues (activeTraceparent); absent when tracing is off. */
  readonly traceparent?: string;
}

/** An entry's flat field list for XADD. */
export function stepEntryFields(entry: NewStepEntry): string[] {
  const f = STEP_ENTRY_FIELDS;
  const out = [f.runId, entry.runId, f.tenant, entry.tenant, f.payload, entry.payload];
  if (entry.workflow !== undefined) out.push(f.workflow, entry.workflow);
  if (entry.step !== undefined) out.push(f.step, entry.step);
  if (entry.state !== undefined) out.push(f.state, JSON.stringify(entry.state));
  if (entry.traceparent !== undefined) out.push(f.traceparent, entry.traceparent);
  return out;
}

/** The entry of the step after `entry`'s: same run, tenant, payload and workflow field; the state grown by `output`. */
export function nextStepEntry(entry: StepEntry, step: string, stepName: string, output: unknown): NewStepEntry {
  const state = output === undefined ? { ...entry.state } : { ...entry.state, [stepName]: output };
  return {
    runId: entry.runId,
    tenant: entry.tenant,
    payload: entry.payload,
    ...(entry.workflow === undefined ? {} : { workflow: entry.workflow }),
    step,
    state,
  };
}
