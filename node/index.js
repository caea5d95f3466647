// dws-event-bus: run `dws event consume` and the other `dws event` verbs
// from Node.js, following the consume contract (docs/consume-contract.md):
// wait for the ready line, iterate events, answer them (ack/nack/progress/
// term), stop cleanly, and get how the run ended as a result or a typed
// error. No dependencies, no build step; types in index.d.ts.

import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { once } from "node:events";

export const READY_RE = /^\[event\] ready event_key=(\S*) bus_pid=(\d+) subscribe_id=(\S+)$/;
export const EXITED_RE =
  /^\[event\] exited \u2014 received (\d+) event\(s\) in ([0-9.]+)s \(reason: ([a-z_]+)\)$/;
const HALTED_RE = /^\[event\] subscription (\S+) halted at seq (\d+):/;
export const LOST_WITHOUT_GOODBYE = "[event] bus connection lost without goodbye";
const ERROR_PREFIX = "Error: ";

// ---- errors ---------------------------------------------------------------

/** Any failure of a `dws` run; `result` is its ExitResult when it exited. */
export class DwsError extends Error {
  constructor(message, result = null) {
    super(message);
    this.name = new.target.name;
    this.result = result;
    this.error = result ? result.error : null;
    this.code = result ? result.code : null;
    this.reply = null;
  }
}
/** Exit 1: runtime failure (bus unreachable or refused, not found, store). */
export class BusError extends DwsError {}
/** Exit 2: usage or validation error. */
export class UsageError extends DwsError {}
/** Exit 3: authentication or permission failure. */
export class PermissionDeniedError extends DwsError {}
/** No ready line within the timeout (the consumer was stopped). */
export class ReadyTimeoutError extends DwsError {}
/** Exit 0 with a reason that ended the run from the bus's side. */
export class ConsumerEndedError extends DwsError {}
/** Reason bus_shutdown: run again (a durable subscription resumes). */
export class BusShutdownError extends ConsumerEndedError {}
/** Reason source_lost: the upstream is gone for good; do not loop. */
export class SourceLostError extends ConsumerEndedError {}
/** Reason halted: the subscription stopped at a poison event. */
export class HaltedError extends ConsumerEndedError {}

/** The error for a non-zero exit code. */
export function errorForCode(code, message, result = null) {
  const cls = { 1: BusError, 2: UsageError, 3: PermissionDeniedError }[code] ?? DwsError;
  return new cls(message, result);
}

// ---- the contract, pure ---------------------------------------------------

/** The ready line's fields, or null. */
export function parseReady(line) {
  const m = READY_RE.exec(line);
  return m ? { event_key: m[1], bus_pid: Number(m[2]), subscribe_id: m[3] } : null;
}

const isProtocolLine = (line) =>
  READY_RE.test(line) || EXITED_RE.test(line) || line === LOST_WITHOUT_GOODBYE;

const ACTIONS = {
  limit: ["done", "--max-events reached"],
  timeout: ["done", "--duration elapsed"],
  signal: ["stopped", "stopped by SIGTERM/SIGINT, stdin EOF or stdout closed"],
  bus_shutdown: [
    "restart",
    "the bus stopped (dws event stop, SIGTERM) or this consumer was" +
      " unsubscribed or stopped: run again (a durable --subscribe-id resumes)",
  ],
  taken_over: [
    "done",
    "another consumer took the subscription over (--takeover): running again" +
      " would take it back",
  ],
  source_lost: [
    "alert",
    "the upstream is gone for good (credentials, configuration): do not loop;" +
      " tell an operator",
  ],
  halted: [
    "inspect-poison",
    "the subscription halted at a poison event (delivered --max-deliver times" +
      " without an ack): an operator looks at it (dws event status) and runs" +
      " dws event subscription restart|skip ID; running again would stop again",
  ],
};
const BY_CODE = {
  1: ["retry", "runtime failure (bus unreachable, refused, protocol, store): retry with backoff"],
  2: ["fix-usage", "usage or validation error: retrying will not help"],
  3: ["fix-permissions", "authentication or permission failure: retrying will not help"],
};

/** What an orchestrator does after one run, as [action, why]. */
export function classify(code, reason, lostWithoutGoodbye) {
  if (code === 0 && reason === "bus_shutdown" && lostWithoutGoodbye) {
    return [
      "restart",
      "the bus vanished without goodbye (crash, kill -9): run again; events" +
        " sent but not acked come again marked redelivered",
    ];
  }
  if (code === 0 && Object.hasOwn(ACTIONS, reason)) return ACTIONS[reason];
  if (Object.hasOwn(BY_CODE, code)) return BY_CODE[code];
  if (code === 0) return ["inspect", `unknown exit reason ${JSON.stringify(reason)} (newer dws?)`];
  return ["inspect", `killed by a signal or unexpected exit status ${code}`];
}

/** How one run ended. `code` is the exit code, or the signal name that
 * killed it; reason/count/seconds come from the exited line (null without). */
export class ExitResult {
  constructor(code, stderr) {
    let exited = null;
    let haltedSeq = null;
    for (const line of stderr) {
      const m = EXITED_RE.exec(line);
      if (m) exited = m;
      const h = HALTED_RE.exec(line);
      if (h) haltedSeq = Number(h[2]);
    }
    const errors = stderr.filter((l) => l.startsWith(ERROR_PREFIX));
    this.code = code;
    this.reason = exited ? exited[3] : null;
    this.count = exited ? Number(exited[1]) : null;
    this.seconds = exited ? Number(exited[2]) : null;
    this.error = errors.length ? errors[0].slice(ERROR_PREFIX.length) : null;
    this.lostWithoutGoodbye = stderr.includes(LOST_WITHOUT_GOODBYE);
    this.haltedSeq = haltedSeq;
    this.stderr = [...stderr];
    [this.action, this.why] = classify(code, this.reason, this.lostWithoutGoodbye);
  }

  /** Ended as asked: limit, timeout or a stop. */
  get ok() {
    return this.action === "done" || this.action === "stopped";
  }

  /** Returns this when ok, else throws the matching DwsError. */
  check() {
    if (this.ok) return this;
    if (this.code !== 0) throw errorForCode(this.code, this.error ?? this.why, this);
    const cls =
      { bus_shutdown: BusShutdownError, source_lost: SourceLostError, halted: HaltedError }[
        this.reason
      ] ?? DwsError;
    throw new cls(`consumer ended (reason: ${this.reason}): ${this.why}`, this);
  }
}

/** A CLI duration: a string as is ("30s"), a number as seconds (sent as ms). */
export function durationArg(d) {
  if (typeof d === "string") return d;
  if (typeof d !== "number" || !(d >= 0)) throw new RangeError(`not a duration: ${d}`);
  return `${Math.round(d * 1000)}ms`;
}

/** The payload's JSON value when it is JSON text, else the payload as is. */
export function decodePayload(data) {
  if (typeof data !== "string") return data;
  try {
    return JSON.parse(data);
  } catch {
    return data;
  }
}

const termLine = (seq, reason = "") => {
  const words = String(reason).split(/\s+/).filter(Boolean).join(" ");
  return words ? `term ${seq} ${words}` : `term ${seq}`;
};

/** One NDJSON event: the wire fields as they are (seq, event_type, data,
 * headers, redelivered, delivery, ...) and methods that answer it. */
export class Event {
  constructor(obj, settle = null) {
    const { type: _always, ...fields } = obj; // "type" is always "event"
    Object.assign(this, fields);
    this.headers ??= {};
    this.data ??= "";
    this.delivery ??= 1;
    this.redelivered ??= false;
    Object.defineProperty(this, "_settle", { value: settle, enumerable: false });
  }
  /** The event's type (`event_type`). */
  get type() {
    return this.event_type;
  }
  /** `data` decoded as JSON (throws when it is not JSON). */
  json() {
    return typeof this.data === "string" ? JSON.parse(this.data) : this.data;
  }
  ack() {
    this.#answer(`ack ${this.seq}`);
  }
  nack(delay) {
    this.#answer(delay === undefined ? `nack ${this.seq}` : `nack ${this.seq} ${durationArg(delay)}`);
  }
  progress() {
    this.#answer(`progress ${this.seq}`);
  }
  term(reason = "") {
    this.#answer(termLine(this.seq, reason));
  }
  #answer(line) {
    if (!this._settle) throw new DwsError("this event was not delivered by a consumer");
    this._settle(line);
  }
}

/** An NDJSON line as an Event, or null when it is not an event object. */
export function parseEvent(line, decodeData = false, settle = null) {
  let obj;
  try {
    obj = JSON.parse(line);
  } catch {
    return null;
  }
  if (obj === null || typeof obj !== "object" || !Number.isInteger(obj.seq)) return null;
  if (decodeData) obj.data = decodePayload(obj.data ?? "");
  return new Event(obj, settle);
}

/** The arguments after `dws event consume` for these options. */
export function consumeArgs(keys = [], o = {}) {
  const out = typeof keys === "string" ? [keys] : [...keys];
  const dur = (d) => (d === undefined || d === null ? undefined : durationArg(d));
  const flags = [
    ["--subscribe-id", o.subscribeId],
    ["--filter", o.filter],
    ["--from", o.from],
    ["--ttl", dur(o.ttl)],
    ["--max-events", o.maxEvents],
    ["--duration", dur(o.duration)],
    ["--ack", o.ack],
    ["--ack-wait", dur(o.ackWait)],
    ["--max-deliver", o.maxDeliver],
    ["--on-poison", o.onPoison],
    ["--backoff", o.backoff?.length ? o.backoff.map(durationArg).join(",") : undefined],
    ["--profile", o.profile],
  ];
  for (const [flag, value] of flags) {
    if (value !== undefined && value !== null) out.push(flag, String(value));
  }
  if (o.ephemeral) out.push("--ephemeral");
  if (o.takeover) out.push("--takeover");
  return out.concat(o.extraArgs ?? []);
}

/** The `--ack` mode a consume command line asks for. */
export function ackMode(args) {
  for (let i = 0; i < args.length; i++) {
    if (args[i].startsWith("--ack=")) return args[i].slice(6);
    if (args[i] === "--ack" && i + 1 < args.length) return args[i + 1];
  }
  return "write";
}

const isBounded = (args) =>
  args.some((a) => /^--(max-events|duration)(=|$)/.test(a));

/** The `dws` to run: the option, else env DWS_BIN, else `dws` on PATH. */
export const findDws = (dws) => dws || process.env.DWS_BIN || "dws";

// ---- the consumer ---------------------------------------------------------

/** One `dws event consume` child. `consume()` builds and starts one. */
export class Consumer {
  constructor(args, { dws, env, decodeData = false, onDiagnostic = null } = {}) {
    this.dws = findDws(dws);
    this.args = ["event", "consume", ...args];
    this.env = env;
    this.decodeData = decodeData;
    this.onDiagnostic = onDiagnostic;
    this.explicitAck = ackMode(args) === "explicit";
    this.stdinEofExits = !isBounded(args);
    this.ready = null;
    this.result = null;
    this.stderrLines = [];
    /** Events read and not yet settled (explicit acks): keepAlive's set. */
    this.held = new Set();
    this.child = null;
    this._queue = [];
    this._ended = false;
    this._wake = null;
  }

  /** Spawns the child and resolves with the ready fields; rejects with
   * the typed error of a run that failed first, or ReadyTimeoutError. */
  async start(timeoutMs = 30000) {
    this.child = spawn(this.dws, this.args, { stdio: ["pipe", "pipe", "pipe"], env: this.env });
    this.child.stdin.on("error", () => {}); // it is exiting: acks are moot
    let spawnError = null;
    const closed = new Promise((resolve) => {
      this.child.on("error", (e) => {
        spawnError = e;
        resolve(null);
      });
      this.child.on("close", (code, sig) => resolve(code === null ? sig : code));
    });
    const stdout = createInterface({ input: this.child.stdout, crlfDelay: Infinity });
    stdout.on("line", (line) => this.#onStdout(line));
    stdout.on("close", () => {
      this._ended = true;
      this._wake?.();
    });
    const stderr = createInterface({ input: this.child.stderr, crlfDelay: Infinity });
    const stderrDone = once(stderr, "close");
    let onReady;
    const readySeen = new Promise((resolve) => (onReady = resolve));
    stderr.on("line", (line) => {
      this.stderrLines.push(line);
      const ready = parseReady(line);
      if (ready && this.ready === null) {
        this.ready = ready;
        onReady();
      } else if (!isProtocolLine(line)) {
        this.onDiagnostic?.(line);
      }
    });
    this._exited = closed.then(async (code) => {
      await stderrDone.catch(() => {});
      if (spawnError) throw new BusError(`cannot run ${this.dws}: ${spawnError.message}`);
      return code;
    });
    this._exited.catch(() => {});
    let timer;
    const timedOut = new Promise((resolve) => (timer = setTimeout(() => resolve("timeout"), timeoutMs)));
    const first = await Promise.race([readySeen.then(() => "ready"), closed.then(() => "exit"), timedOut]);
    clearTimeout(timer);
    if (first === "ready") return this.ready;
    if (first === "timeout") {
      this.stop();
      throw new ReadyTimeoutError(`no ready line within ${timeoutMs} ms`, await this.wait());
    }
    const result = await this.wait();
    if (result.code !== 0) throw errorForCode(result.code, result.error ?? `dws exited with ${result.code}`, result);
    throw new DwsError(`dws exited before its ready line (reason: ${result.reason})`, result);
  }

  #onStdout(line) {
    if (!line.trim()) return;
    const ev = parseEvent(line, this.decodeData, (l) => this.#write(l));
    if (ev === null) {
      this.onDiagnostic?.(`not an event: ${line.slice(0, 200)}`);
      return;
    }
    if (this.explicitAck) this.held.add(ev.seq);
    this._queue.push(ev);
    this._wake?.();
  }

  /** Yields each event until stdout closes (the run ended; wait() says why). */
  async *events() {
    for (;;) {
      if (this._queue.length) {
        yield this._queue.shift();
      } else if (this._ended) {
        return;
      } else {
        await new Promise((resolve) => (this._wake = resolve));
        this._wake = null;
      }
    }
  }

  [Symbol.asyncIterator]() {
    return this.events();
  }

  /** The event is handled (with ack "explicit"). */
  ack(seq) {
    this.#write(`ack ${seq}`);
  }
  /** Every event delivered up to seq and not yet settled is handled. */
  ackUpto(seq) {
    this.#write(`ack-upto ${seq}`);
  }
  /** Handling failed: deliver it again (after delay). */
  nack(seq, delay) {
    this.#write(delay === undefined ? `nack ${seq}` : `nack ${seq} ${durationArg(delay)}`);
  }
  /** Still working on it: its ack wait starts again. */
  progress(seq) {
    this.#write(`progress ${seq}`);
  }
  /** It can never succeed: park it now with a reason (one line). */
  term(seq, reason = "") {
    this.#write(termLine(seq, reason));
  }

  /** Awaits work (a promise, or a function returning one) while writing
   * `progress SEQ` for every held event each everyMs; resolves with how
   * many rounds it wrote. */
  async keepAlive(work, everyMs) {
    let rounds = 0;
    const timer = setInterval(() => {
      for (const seq of this.held) this.progress(seq);
      rounds++;
    }, everyMs);
    try {
      await (typeof work === "function" ? work() : work);
    } finally {
      clearInterval(timer);
    }
    return rounds;
  }

  #write(line) {
    const [verb, seq] = line.split(" ");
    if (verb === "ack-upto") {
      for (const s of this.held) if (s <= Number(seq)) this.held.delete(s);
    } else if (verb !== "progress") {
      this.held.delete(Number(seq));
    }
    if (this.child?.stdin.writable) this.child.stdin.write(`${line}\n`);
  }

  /** Asks the child to finish cleanly: "sigterm", or "stdin" (EOF; the
   * acks written before reach it first). Never SIGKILL. */
  stop(how = "sigterm") {
    if (!this.child) return;
    if (how === "stdin") this.child.stdin.end();
    else if (how !== "sigterm") throw new RangeError("how: sigterm or stdin");
    else if (this.child.exitCode === null && this.child.signalCode === null) {
      this.child.kill("SIGTERM");
    }
  }

  /** Resolves with how the run ended, once it exited. */
  async wait() {
    if (this.result) return this.result;
    if (!this._exited) throw new DwsError("start() first");
    const code = await this._exited;
    this.child.stdin.end();
    this.result ??= new ExitResult(code, this.stderrLines);
    return this.result;
  }

  /** Stops the child (unless it already ended) and waits. */
  async close() {
    if (this.child && this.child.exitCode === null && this.child.signalCode === null) {
      if (this.explicitAck) {
        // The acks written so far reach dws before the EOF, which ends an
        // unbounded run; a bounded one gets SIGTERM after.
        this.stop("stdin");
        const graceMs = this.stdinEofExits ? 10000 : 2000;
        let timer;
        await Promise.race([this._exited.catch(() => {}), new Promise((r) => (timer = setTimeout(r, graceMs)))]);
        clearTimeout(timer);
      }
      this.stop("sigterm");
    }
    return this.wait();
  }
}

/** Starts `dws event consume KEYS... [flags]`; resolves once it is ready.
 *
 *     const c = await consume("demo.*", { ack: "explicit" });
 *     for await (const ev of c) { handle(ev.data); ev.ack(); }
 *     const result = await c.wait();
 */
export async function consume(keys = [], options = {}) {
  const { dws, env, decodeData, onDiagnostic, readyTimeoutMs } = options;
  const c = new Consumer(consumeArgs(keys, options), { dws, env, decodeData, onDiagnostic });
  await c.start(readyTimeoutMs);
  return c;
}

/** Yields events across runs: after bus_shutdown it runs again at once (up
 * to `restarts` times; default no limit), retries exit 1 with backoff up to
 * `retries` times in a row; returns on limit/timeout/a stop, throws on every
 * other end. Breaking out stops the current child cleanly. */
export async function* consumeForever(keys = [], options = {}) {
  const { restarts = Infinity, retries = 5, maxBackoffMs = 30000, onReady } = options;
  let done = 0;
  let failures = 0;
  for (;;) {
    let c;
    try {
      c = await consume(keys, options);
    } catch (e) {
      if (!(e instanceof BusError) || ++failures > retries) throw e;
      await new Promise((r) => setTimeout(r, Math.min(500 * 2 ** (failures - 1), maxBackoffMs)));
      continue;
    }
    failures = 0;
    onReady?.(c.ready);
    let result;
    try {
      for await (const ev of c) yield ev;
    } finally {
      result = await c.close();
    }
    try {
      result.check();
      return;
    } catch (e) {
      if (!(e instanceof BusShutdownError) || ++done > restarts) throw e;
    }
  }
}

// ---- the verbs ------------------------------------------------------------

const flagsOf = (pairs) =>
  pairs.flatMap(([flag, v]) =>
    v === undefined || v === null || v === false ? [] : v === true ? [flag] : [flag, String(v)],
  );

/** The other `dws event` verbs, each run with `--format json`; resolve with
 * the parsed reply, reject with UsageError / BusError / PermissionDeniedError. */
export class Dws {
  constructor({ dws, profile, env, timeoutMs = 60000 } = {}) {
    this.dws = findDws(dws);
    this.profile = profile;
    this.env = env;
    this.timeoutMs = timeoutMs;
  }

  /** Runs `dws event ARGS...` (with --profile); resolves with the JSON reply. */
  run(args, input = "") {
    const argv = ["event", ...args, ...(this.profile ? ["--profile", this.profile] : [])];
    return new Promise((resolve, reject) => {
      const child = spawn(this.dws, argv, { env: this.env, timeout: this.timeoutMs });
      const out = [];
      const err = [];
      child.stdout.on("data", (b) => out.push(b));
      child.stderr.on("data", (b) => err.push(b));
      child.stdin.on("error", () => {});
      child.on("error", (e) => reject(new BusError(`cannot run ${this.dws}: ${e.message}`)));
      child.on("close", (code, sig) => {
        const stdout = Buffer.concat(out).toString("utf8");
        const stderr = Buffer.concat(err).toString("utf8");
        try {
          resolve(reply(code === null ? sig : code, stdout, stderr));
        } catch (e) {
          reject(e);
        }
      });
      child.stdin.end(input);
    });
  }

  /** Publishes one event (a string as is, anything else as JSON). */
  publish(eventType, data = "", { id } = {}) {
    const text = typeof data === "string" ? data : JSON.stringify(data);
    return this.run(["publish", eventType, "-", "--format", "json", ...flagsOf([["--id", id]])], text);
  }
  /** Creates a durable subscription (a no-op when it exists with this spec). */
  subscribe(keys, o = {}) {
    const ks = typeof keys === "string" ? [keys] : [...keys];
    const dur = (d) => (d === undefined ? undefined : durationArg(d));
    return this.run([
      "subscribe", ...ks,
      ...flagsOf([
        ["--id", o.id], ["--filter", o.filter], ["--from", o.from], ["--ttl", dur(o.ttl)],
        ["--max-deliver", o.maxDeliver], ["--on-poison", o.onPoison],
        ["--backoff", o.backoff?.length ? o.backoff.map(durationArg).join(",") : undefined],
      ]),
      ...(o.extraArgs ?? []), "--format", "json",
    ]);
  }
  unsubscribe(...ids) {
    return this.run(["unsubscribe", ...ids, "--format", "json"]);
  }
  /** The status document (`running: false` when no bus runs). */
  status() {
    return this.run(["status", "--format", "json"]);
  }
  /** Stops the bus, or only the consumers of these subscriptions. */
  stop(subscribeIds = [], { dryRun = false } = {}) {
    const ids = subscribeIds.flatMap((s) => ["--subscribe-id", s]);
    return this.run(["stop", ...ids, ...flagsOf([["--dry-run", dryRun]]), "--format", "json"]);
  }
  /** `dws event subscription VERB ARGS... --format json` (any verb). */
  subscription(verb, ...args) {
    return this.run(["subscription", verb, ...args, "--format", "json"]);
  }
  restart(id, { dryRun = false } = {}) {
    return this.subscription("restart", id, ...flagsOf([["--dry-run", dryRun]]));
  }
  skip(id, { dryRun = false } = {}) {
    return this.subscription("skip", id, ...flagsOf([["--dry-run", dryRun]]));
  }
  disable(id) {
    return this.subscription("disable", id);
  }
  enable(id) {
    return this.subscription("enable", id);
  }
  seek(id, to, { dryRun = false } = {}) {
    return this.subscription("seek", id, "--to", String(to), ...flagsOf([["--dry-run", dryRun]]));
  }
  parked(id) {
    return this.subscription("parked", id);
  }
  replayParked(id, ...seqs) {
    return this.subscription("replay-parked", id, ...seqs.map(String));
  }
}

/** A verb's JSON reply, or the typed error of its exit (with `reply` set
 * when it printed one anyway, as unsubscribe does for not_found). */
export function reply(code, stdout, stderr) {
  const lines = stderr.split("\n").filter(Boolean);
  let doc = null;
  try {
    doc = stdout.trim() ? JSON.parse(stdout) : null;
  } catch {
    doc = null;
  }
  if (code !== 0) {
    const result = new ExitResult(code, lines);
    const e = errorForCode(code, result.error ?? (stderr.trim() || `exit ${code}`), result);
    e.reply = doc !== null && typeof doc === "object" ? doc : null;
    throw e;
  }
  if (doc === null || typeof doc !== "object") {
    throw new DwsError(`not a JSON reply: ${JSON.stringify(stdout.slice(0, 200))}`);
  }
  return doc;
}
