// Types of dws-event-bus (index.cjs, and index.js through index.d.ts): the
// `dws event consume` contract (docs/consume-contract.md) and the
// `dws event` verbs.

/** A CLI duration: a string as dws reads it ("30s", "2m"), or seconds. */
export type Duration = string | number;

export type Reason =
  | "limit"
  | "timeout"
  | "signal"
  | "bus_shutdown"
  | "stopped"
  | "taken_over"
  | "source_lost"
  | "halted";
export type Action =
  | "done" | "stopped" | "restart" | "retry" | "alert" | "inspect-poison"
  | "fix-usage" | "fix-permissions" | "inspect";

export interface Ready {
  event_key: string;
  bus_pid: number;
  subscribe_id: string;
}

export class DwsError extends Error {
  constructor(message: string, result?: ExitResult | null);
  /** The run's result, when it exited. */
  result: ExitResult | null;
  /** The text of the `Error:` line. */
  error: string | null;
  code: number | string | null;
  /** A verb's JSON reply printed despite the failure (unsubscribe's not_found). */
  reply: Record<string, unknown> | null;
}
export class BusError extends DwsError {}
export class UsageError extends DwsError {}
export class PermissionDeniedError extends DwsError {}
export class ReadyTimeoutError extends DwsError {}
/** A ready, exited or halted line that does not parse, or an NDJSON line
 * over the line limit: not a dws this library can drive. */
export class ContractError extends DwsError {}
export class ConsumerEndedError extends DwsError {}
export class BusShutdownError extends ConsumerEndedError {}
export class SourceLostError extends ConsumerEndedError {}
export class HaltedError extends ConsumerEndedError {}
export function errorForCode(code: number, message: string, result?: ExitResult | null): DwsError;

export class ExitResult {
  constructor(code: number | string, stderr: string[]);
  /** The exit code, or the name of the signal that killed it. */
  code: number | string;
  reason: Reason | string | null;
  count: number | null;
  seconds: number | null;
  error: string | null;
  lostWithoutGoodbye: boolean;
  haltedSeq: number | null;
  stderr: string[];
  action: Action;
  why: string;
  readonly ok: boolean;
  /** Why parseExit() throws ContractError for this stderr, else null. */
  readonly malformed: string | null;
  /** Returns this when ok, else throws the matching DwsError. */
  check(): this;
}
/** The result of a run; a malformed exited or halted line throws ContractError. */
export function parseExit(code: number | string, stderr: string[]): ExitResult;

/** One NDJSON event line (fields as on the wire; newer ones kept too). */
export class Event {
  constructor(obj: Record<string, unknown>, settle?: ((line: string) => void) | null);
  seq: number;
  event_type: string;
  /** The payload string, or with decodeData its JSON value. */
  data: unknown;
  event_id?: string;
  subscribe_id?: string;
  source_id?: string;
  headers: Record<string, string>;
  received_at_unix_ms?: number;
  redelivered: boolean;
  delivery: number;
  event_born_time?: number;
  event_corp_id?: string;
  event_unified_app_id?: string;
  rule_type?: string;
  [field: string]: unknown;
  readonly type: string;
  json(): unknown;
  ack(): void;
  nack(delay?: Duration): void;
  progress(): void;
  term(reason?: string): void;
}

export interface ConsumeOptions {
  subscribeId?: string;
  ephemeral?: boolean;
  filter?: string;
  from?: string | number;
  ttl?: Duration;
  maxEvents?: number;
  duration?: Duration;
  takeover?: boolean;
  ack?: "write" | "explicit";
  ackWait?: Duration;
  maxDeliver?: number;
  onPoison?: "halt" | "park";
  /** One duration, a string as dws reads it ("1s,10s"), or an array. */
  backoff?: Duration | Duration[];
  /** Most events unacked at once to this consumer (its credit window). */
  maxInFlight?: number;
  profile?: string;
  /** Passed as they are (flags newer than this library). */
  extraArgs?: string[];
}

export interface RunOptions {
  /** Path of dws (default: env DWS_BIN, else dws on PATH). */
  dws?: string;
  env?: NodeJS.ProcessEnv;
  /** Decode `data` as JSON when it is JSON text. */
  decodeData?: boolean;
  /** Gap, source and Error lines (everything but ready/exited). */
  onDiagnostic?: ((line: string) => void) | null;
  /** Milliseconds a stopped dws has to exit after SIGTERM before SIGKILL
   * (default STOP_GRACE_MS, 10000). */
  stopGraceMs?: number;
}

export class Consumer implements AsyncIterable<Event> {
  constructor(args: string[], options?: RunOptions);
  ready: Ready | null;
  result: ExitResult | null;
  explicitAck: boolean;
  /** The library's own --max-events with explicit acks, else null. */
  maxEvents: number | null;
  /** Events handed to the program by the iterator. */
  handed: number;
  stderrLines: string[];
  held: Set<number>;
  start(timeoutMs?: number): Promise<Ready>;
  events(): AsyncGenerator<Event, void, undefined>;
  [Symbol.asyncIterator](): AsyncGenerator<Event, void, undefined>;
  ack(seq: number): void;
  ackUpto(seq: number): void;
  nack(seq: number, delay?: Duration): void;
  progress(seq: number): void;
  term(seq: number, reason?: string): void;
  keepAlive(work: Promise<unknown> | (() => Promise<unknown>), everyMs: number): Promise<number>;
  stop(how?: "sigterm" | "stdin"): void;
  wait(): Promise<ExitResult>;
  close(): Promise<ExitResult>;
}

export function consume(
  keys?: string | string[],
  options?: ConsumeOptions & RunOptions & { readyTimeoutMs?: number },
): Promise<Consumer>;

export function consumeForever(
  keys?: string | string[],
  options?: ConsumeOptions & RunOptions & {
    readyTimeoutMs?: number;
    /** Runs again after bus_shutdown up to this many times (default: no limit). */
    restarts?: number;
    /** Exit-1 failures in a row retried with backoff (default 5). */
    retries?: number;
    maxBackoffMs?: number;
    onReady?: (ready: Ready) => void;
  },
): AsyncGenerator<Event, void, undefined>;

export type Doc = Record<string, any>;

export class Dws {
  /** timeoutMs: a verb's answer (default 60000), then SIGTERM, and SIGKILL
   * stopGraceMs later (default STOP_GRACE_MS). */
  constructor(options?: {
    dws?: string; profile?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number; stopGraceMs?: number;
  });
  run(args: string[], input?: string): Promise<Doc>;
  publish(eventType: string, data?: unknown, options?: { id?: string }): Promise<Doc>;
  subscribe(
    keys: string | string[],
    options?: {
      id?: string; filter?: string; from?: string | number; ttl?: Duration;
      maxDeliver?: number; onPoison?: "halt" | "park"; backoff?: Duration | Duration[];
      /** "shared": a work queue, each event to one of its consumers. */
      delivery?: "per-host" | "shared"; where?: string;
      extraArgs?: string[];
    },
  ): Promise<Doc>;
  unsubscribe(...ids: string[]): Promise<Doc>;
  status(): Promise<Doc>;
  stop(subscribeIds?: string[], options?: { dryRun?: boolean }): Promise<Doc>;
  subscription(verb: string, ...args: string[]): Promise<Doc>;
  restart(id: string, options?: { dryRun?: boolean }): Promise<Doc>;
  skip(id: string, options?: { dryRun?: boolean }): Promise<Doc>;
  disable(id: string): Promise<Doc>;
  enable(id: string): Promise<Doc>;
  seek(id: string, to: string | number, options?: { dryRun?: boolean }): Promise<Doc>;
  parked(id: string): Promise<Doc>;
  replayParked(id: string, ...seqs: number[]): Promise<Doc>;
}

export const READY_RE: RegExp;
export const EXITED_RE: RegExp;
export const LOST_WITHOUT_GOODBYE: string;
export function parseReady(line: string): Ready | null;
export function parseEvent(line: string, decodeData?: boolean, settle?: ((line: string) => void) | null): Event | null;
export function classify(code: number | string | null, reason: string | null, lostWithoutGoodbye: boolean): [Action, string];
export function durationArg(d: Duration): string;
export function backoffArg(b: Duration | Duration[] | undefined | null): string | undefined;
export function takeMaxEvents(args: string[]): [number | null, string[]];
export const STOP_GRACE_MS: number;
export const STDOUT_LINE_LIMIT: number;
export const STDERR_LINE_LIMIT: number;
export function decodePayload(data: unknown): unknown;
export function consumeArgs(keys?: string | string[], options?: ConsumeOptions): string[];
export function ackMode(args: string[]): string;
export function reply(code: number | string, stdout: string, stderr: string): Doc;
export function findDws(dws?: string): string;
