// dws-event-bus: run `dws event consume` and the other `dws event` verbs
// from Node.js, following the consume contract (docs/consume-contract.md):
// wait for the ready line, iterate events, answer them (ack/nack/progress/
// term), stop cleanly, and get how the run ended as a result or a typed
// error. No dependencies, no build step. This is the code, as CommonJS
// (`require("dws-event-bus")`); index.js is the ES module entry, which
// exports these same objects. Types in index.d.cts (and index.d.ts).
//
// No wait is unbounded: a run ends at the exit of dws (not when its pipes
// close), its lines are bounded (the rest of an over-long line is read and
// dropped), and a dws that does not exit after SIGTERM is killed after a
// grace period. A contract line that does not parse is a ContractError.

"use strict";

const { spawn } = require("node:child_process");

// Digits are bounded so that every number is exact: a pid fits 10 digits, a
// count and a seq 15 (below 2^53, where a JavaScript number stops being
// exact; far more events than any run delivers, and seqs than a bus has).
const READY_PREFIX = "[event] ready ";
const EXITED_PREFIX = "[event] exited ";
const READY_RE = /^\[event\] ready event_key=(\S*) bus_pid=(\d{1,10}) subscribe_id=(\S+)$/;
const EXITED_RE =
  /^\[event\] exited \u2014 received (\d{1,15}) event\(s\) in (\d{1,15}(?:\.\d{1,9})?)s \(reason: ([a-z_]{1,64})\)$/;
const HALTED_RE = /^\[event\] subscription (\S+) halted at seq (\d+):/;
const LOST_WITHOUT_GOODBYE = "[event] bus connection lost without goodbye";
const ERROR_PREFIX = "Error: ";

/** Longest NDJSON line kept: far above the bus's largest event (4 MiB
 * encoded, at most 6 times that as escaped JSON). A longer one is a
 * ContractError. */
const STDOUT_LINE_LIMIT = 64 * 1024 * 1024;
/** Longest stderr line kept (dws's are far shorter); the rest is dropped. */
const STDERR_LINE_LIMIT = 64 * 1024;
/** Milliseconds a dws has to exit after SIGTERM before SIGKILL (a clean
 * exit takes about 4 s at most: 2 s for stdout, 2 s to remove an owned
 * subscription). */
const STOP_GRACE_MS = 10000;
/** With explicit acks, after stdin EOF: how long the run has to end by
 * itself (dws ends every run at EOF once its acks are in). */
const EOF_GRACE_MS = 10000;
/** After SIGKILL, how long to wait for the exit before giving up. */
const KILL_WAIT_MS = 10000;
/** After the exit, the longest time spent reading what the pipes still
 * hold (only a process dws started, keeping them open and writing, lasts). */
const DRAIN_MS = 2000;

// ---- errors ---------------------------------------------------------------

/** Any failure of a `dws` run; `result` is its ExitResult when it exited. */
class DwsError extends Error {
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
class BusError extends DwsError {}
/** Exit 2: usage or validation error. */
class UsageError extends DwsError {}
/** Exit 3: authentication or permission failure. */
class PermissionDeniedError extends DwsError {}
/** No ready line within the timeout (the consumer was stopped). */
class ReadyTimeoutError extends DwsError {}
/** The dws broke the consume contract: a ready, exited or halted line that
 * does not parse, or an NDJSON line over the line limit. */
class ContractError extends DwsError {}
/** Exit 0 with a reason that ended the run from the bus's side. */
class ConsumerEndedError extends DwsError {}
/** Reason bus_shutdown: run again (a durable subscription resumes). */
class BusShutdownError extends ConsumerEndedError {}
/** Reason source_lost: the upstream is gone for good; do not loop. */
class SourceLostError extends ConsumerEndedError {}
/** Reason halted: the subscription stopped at a poison event. */
class HaltedError extends ConsumerEndedError {}

/** The error for a non-zero exit code. */
function errorForCode(code, message, result = null) {
  const cls = { 1: BusError, 2: UsageError, 3: PermissionDeniedError }[code] ?? DwsError;
  return new cls(message, result);
}

// ---- the contract, pure ---------------------------------------------------

const shown = (line) =>
  JSON.stringify(line.slice(0, 120)) + (line.length > 120 ? `...(${line.length} chars)` : "");

/** The ready line's fields; null for any other line. A line that starts as
 * a ready line but does not parse throws ContractError. */
function parseReady(line) {
  if (!line.startsWith(READY_PREFIX)) return null;
  const m = READY_RE.exec(line);
  if (!m) throw new ContractError(`malformed ready line: ${shown(line)}`);
  return { event_key: m[1], bus_pid: Number(m[2]), subscribe_id: m[3] };
}

const isProtocolLine = (line) =>
  line.startsWith(READY_PREFIX) || line.startsWith(EXITED_PREFIX) || line === LOST_WITHOUT_GOODBYE;

const ACTIONS = {
  limit: ["done", "--max-events reached"],
  timeout: ["done", "--duration elapsed"],
  signal: ["stopped", "stopped by SIGTERM/SIGINT, stdin EOF or stdout closed"],
  bus_shutdown: [
    "restart",
    "the bus stopped (dws event stop, SIGTERM) or this consumer was" +
      " unsubscribed: run again (a durable --subscribe-id resumes)",
  ],
  stopped: [
    "done",
    "an operator stopped this consumer (dws event stop --subscribe-id):" +
      " do not restart it",
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
function classify(code, reason, lostWithoutGoodbye) {
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
class ExitResult {
  constructor(code, stderr) {
    let exited = null;
    let haltedSeq = null;
    let malformed = null;
    for (const line of stderr) {
      if (line.startsWith(EXITED_PREFIX)) {
        const m = EXITED_RE.exec(line);
        if (m) exited = m;
        else malformed ??= `malformed exited line: ${shown(line)}`;
      }
      const h = HALTED_RE.exec(line);
      if (h && h[2].length > 15) malformed ??= `malformed halted line: ${shown(line)}`;
      else if (h) haltedSeq = Number(h[2]);
    }
    if (malformed) exited = null;
    // Why parseExit() throws ContractError for these lines (else null).
    Object.defineProperty(this, "malformed", { value: malformed, enumerable: false });
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

/** The result of a run from its exit code and stderr lines; a malformed
 * exited or halted line throws ContractError (its result has the rest). */
function parseExit(code, stderr) {
  const r = new ExitResult(code, stderr);
  if (r.malformed) throw new ContractError(r.malformed, r);
  return r;
}

/** A CLI duration: a string as is ("30s"), a number as seconds (sent as ms). */
function durationArg(d) {
  if (typeof d === "string") return d;
  if (typeof d !== "number" || !(d >= 0)) throw new RangeError(`not a duration: ${d}`);
  return `${Math.round(d * 1000)}ms`;
}

/** `--backoff`'s value: a string as dws reads it ("1s,10s"), one duration,
 * or an array of durations joined by "," (undefined: no flag). */
function backoffArg(b) {
  if (b === undefined || b === null) return undefined;
  if (!Array.isArray(b)) return durationArg(b);
  return b.length ? b.map(durationArg).join(",") : undefined;
}

/** The payload's JSON value when it is JSON text, else the payload as is. */
function decodePayload(data) {
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
class Event {
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
function parseEvent(line, decodeData = false, settle = null) {
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
function consumeArgs(keys = [], o = {}) {
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
    ["--backoff", backoffArg(o.backoff)],
    ["--max-in-flight", o.maxInFlight],
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
function ackMode(args) {
  for (let i = 0; i < args.length; i++) {
    if (args[i].startsWith("--ack=")) return args[i].slice(6);
    if (args[i] === "--ack" && i + 1 < args.length) return args[i + 1];
  }
  return "write";
}

/** `--max-events N` taken out of a command line: [N, the rest]. With
 * explicit acks the library counts the events itself, so that the last
 * ones' acks reach dws before it stops (a dws that stops at its own
 * --max-events may exit before reading them). A value dws would refuse is
 * left in, for dws to say so. */
function takeMaxEvents(args) {
  const rest = [];
  let limit = null;
  for (let i = 0; i < args.length; i++) {
    let value = null;
    let skip = 0;
    if (args[i] === "--max-events" && i + 1 < args.length) [value, skip] = [args[i + 1], 1];
    else if (args[i].startsWith("--max-events=")) value = args[i].slice(13);
    if (value !== null && /^[0-9]{1,15}$/.test(value) && Number(value) > 0) {
      limit = Number(value);
      i += skip;
    } else {
      rest.push(args[i]);
    }
  }
  return [limit, rest];
}

/** Splits a byte stream into lines without ever holding more than `limit`
 * bytes of one: each line comes as [Buffer of its first bytes, bytes cut]
 * (a view of the chunk when it lies within one: read it before the next). */
class Lines {
  constructor(limit) {
    this.limit = limit;
    this.parts = [];
    this.size = 0;
    this.cut = 0;
  }
  push(buf) {
    const out = [];
    let start = 0;
    for (;;) {
      const nl = buf.indexOf(10, start);
      if (nl >= 0 && this.size === 0 && this.cut === 0 && nl - start <= this.limit) {
        out.push([buf.subarray(start, nl), 0]); // a whole line of this chunk: no copy
      } else {
        this.#add(buf.subarray(start, nl < 0 ? buf.length : nl));
        if (nl >= 0) out.push(this.#take());
      }
      if (nl < 0) return out;
      start = nl + 1;
    }
  }
  /** The last line, when the stream ended without a newline. */
  end() {
    return this.size || this.cut ? [this.#take()] : [];
  }
  #add(b) {
    const room = this.limit - this.size;
    const kept = b.length <= room ? b : b.subarray(0, room);
    if (kept.length) {
      this.parts.push(Buffer.from(kept)); // a copy: the chunk is not kept alive
      this.size += kept.length;
    }
    this.cut += b.length - kept.length;
  }
  #take() {
    const line = [Buffer.concat(this.parts, this.size), this.cut];
    this.parts = [];
    this.size = 0;
    this.cut = 0;
    return line;
  }
}

/** The `dws` to run: the option, else env DWS_BIN, else `dws` on PATH. */
const findDws = (dws) => dws || process.env.DWS_BIN || "dws";

/** Follows a child to its end, which is its exit (not the close of its
 * pipes): onChunk(i, chunk) gets what stdout (i = 0) and stderr (1) bring,
 * onEof(i) a pipe's end. Once the child exited, each turn of the event loop
 * reads what the pipes still hold; when a turn brought nothing, or both
 * ended (at most DRAIN_MS), they are destroyed, so a process the child
 * started that kept them open does not hold the end, and done(null) is
 * called; done(error) after a failed spawn. */
function followChild(child, { onChunk, onEof = () => {}, done }) {
  const streams = [child.stdout, child.stderr];
  let bytes = 0;
  let open = streams.length;
  let finished = false;
  const finish = (error) => {
    if (finished) return;
    finished = true;
    for (const stream of streams) stream.destroy();
    done(error);
  };
  streams.forEach((stream, i) => {
    stream.on("data", (chunk) => {
      if (finished) return;
      bytes += chunk.length;
      onChunk(i, chunk);
    });
    stream.on("error", () => {});
    stream.on("end", () => {
      open--;
      onEof(i);
    });
  });
  child.on("error", (e) => {
    if (child.pid === undefined) finish(e); // else a failed kill: the exit still comes
  });
  child.on("exit", () => {
    const deadline = Date.now() + DRAIN_MS;
    let seen = bytes;
    const turn = () => {
      if (open === 0 || bytes === seen || Date.now() > deadline) return finish(null);
      seen = bytes;
      setImmediate(turn);
    };
    setImmediate(turn);
  });
}

// ---- the consumer ---------------------------------------------------------

/** One `dws event consume` child. `consume()` builds and starts one. With
 * explicit acks, `--max-events N` is counted here: after the handler of the
 * Nth event returned, the run is stopped (its acks reach dws first) and
 * ends with reason `limit`. */
class Consumer {
  constructor(args, { dws, env, decodeData = false, onDiagnostic = null, stopGraceMs = STOP_GRACE_MS } = {}) {
    let rest = [...args];
    this.explicitAck = ackMode(rest) === "explicit";
    /** The library's own --max-events (explicit acks), else null. */
    this.maxEvents = null;
    if (this.explicitAck) [this.maxEvents, rest] = takeMaxEvents(rest);
    this.dws = findDws(dws);
    this.args = ["event", "consume", ...rest];
    this.env = env;
    this.decodeData = decodeData;
    this.onDiagnostic = onDiagnostic;
    this.stopGraceMs = stopGraceMs;
    this.stdinEofExits = true;
    this.ready = null;
    this.result = null;
    this.stderrLines = [];
    /** Events read and not yet settled (explicit acks): keepAlive's set. */
    this.held = new Set();
    /** Events handed to the program by the iterator. */
    this.handed = 0;
    this.child = null;
    this._queue = [];
    this._ended = false;
    this._wake = null;
    this._error = null; // a stderr line broke the contract
    this._spawnError = null;
  }

  /** Spawns the child and resolves with the ready fields; rejects with the
   * typed error of a run that failed first, ContractError for a malformed
   * ready line, or ReadyTimeoutError. The child is then stopped (SIGTERM,
   * SIGKILL after stopGraceMs). */
  async start(timeoutMs = 30000) {
    const child = spawn(this.dws, this.args, { stdio: ["pipe", "pipe", "pipe"], env: this.env });
    this.child = child;
    child.stdin.on("error", () => {}); // it is exiting: acks are moot
    let wakeStart;
    const readyOrEnd = new Promise((resolve) => (wakeStart = resolve));
    this._wakeStart = wakeStart;
    let ended;
    this._endedP = new Promise((resolve) => (ended = resolve));
    const lines = [new Lines(STDOUT_LINE_LIMIT), new Lines(STDERR_LINE_LIMIT)];
    const sinks = [(line, cut) => this.#onStdout(line, cut), (line, cut) => this.#onStderr(line, cut)];
    const flush = (i) => {
      for (const [line, cut] of lines[i].end()) sinks[i](line, cut);
    };
    followChild(child, {
      onChunk: (i, chunk) => {
        for (const [line, cut] of lines[i].push(chunk)) sinks[i](line, cut);
      },
      onEof: flush,
      done: (error) => {
        this._spawnError = error;
        flush(0);
        flush(1);
        this._ended = true;
        this._wake?.();
        wakeStart();
        ended();
      },
    });
    let timer;
    const timedOut = new Promise((resolve) => (timer = setTimeout(() => resolve("timeout"), timeoutMs)));
    const first = await Promise.race([readyOrEnd.then(() => "woken"), timedOut]);
    clearTimeout(timer);
    if (this.ready !== null && this._error === null) return this.ready;
    const timedOutNow = first === "timeout" && this._error === null && !this.#exited();
    await this.#terminate();
    const result = await this.#waitBounded(); // throws a ContractError of stderr
    if (timedOutNow) throw new ReadyTimeoutError(`no ready line within ${timeoutMs} ms`, result);
    if (result.code !== 0) throw errorForCode(result.code, result.error ?? `dws exited with ${result.code}`, result);
    throw new DwsError(`dws exited before its ready line (reason: ${result.reason})`, result);
  }

  #onStderr(buf, cut) {
    let line = buf.toString("utf8");
    if (line.endsWith("\r")) line = line.slice(0, -1);
    if (cut) line += ` ...(${cut} more bytes discarded)`;
    this.stderrLines.push(line);
    let ready;
    try {
      ready = parseReady(line);
    } catch (e) {
      if (!(e instanceof ContractError)) throw e;
      this._error ??= e;
      this._wakeStart();
      return;
    }
    if (ready) {
      if (this.ready === null) {
        this.ready = ready;
        this._wakeStart();
      }
    } else if (!isProtocolLine(line)) {
      this.onDiagnostic?.(line);
    }
  }

  #onStdout(buf, cut) {
    if (cut) {
      const size = buf.length + cut;
      this.#enqueue(new ContractError(`an NDJSON line of ${size} bytes is over the limit of ${STDOUT_LINE_LIMIT} bytes (discarded)`));
      return;
    }
    const line = buf.toString("utf8");
    if (!line.trim()) return;
    const ev = parseEvent(line, this.decodeData, (l) => this.#write(l));
    if (ev === null) {
      this.onDiagnostic?.(`not an event: ${line.slice(0, 200)}`);
      return;
    }
    if (this.explicitAck) this.held.add(ev.seq);
    this.#enqueue(ev);
  }

  #enqueue(item) {
    this._queue.push(item);
    this._wake?.();
  }

  /** Yields each event until the run ended (the exit of dws; wait() says
   * why). An NDJSON line over the line limit throws ContractError here (the
   * run goes on). */
  async *events() {
    for (;;) {
      if (this.#limitReached()) {
        await this.close();
        return;
      }
      if (this._queue.length) {
        const item = this._queue.shift();
        if (item instanceof DwsError) throw item;
        this.handed++;
        yield item;
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

  #exited() {
    return this.child !== null && (this.child.exitCode !== null || this.child.signalCode !== null);
  }

  #limitReached() {
    return this.maxEvents !== null && this.handed >= this.maxEvents;
  }

  #signal(sig) {
    if (this.child && !this.#exited()) this.child.kill(sig);
  }

  /** True once the run ended (exit and pipes read) within ms. */
  async #endedWithin(ms) {
    let timer;
    const out = await Promise.race([
      this._endedP.then(() => true),
      new Promise((resolve) => (timer = setTimeout(() => resolve(false), ms))),
    ]);
    clearTimeout(timer);
    return out;
  }

  /** SIGTERM; SIGKILL when it did not exit within stopGraceMs. */
  async #terminate() {
    if (this.#exited()) return;
    this.#signal("SIGTERM");
    if (await this.#endedWithin(this.stopGraceMs)) return;
    this.#signal("SIGKILL");
    await this.#endedWithin(KILL_WAIT_MS);
  }

  /** Asks the child to finish cleanly: "sigterm", or "stdin" (EOF; the
   * acks written before reach it first). Never SIGKILL (only close() and a
   * failed start() kill, a dws still running stopGraceMs after SIGTERM). */
  stop(how = "sigterm") {
    if (!this.child) return;
    if (how === "stdin") this.child.stdin.end();
    else if (how !== "sigterm") throw new RangeError("how: sigterm or stdin");
    else this.#signal("SIGTERM");
  }

  /** Resolves with how the run ended, once it exited (a malformed exited
   * line rejects with ContractError). Once the library's own maxEvents were
   * handed out, it stops the run first. */
  async wait() {
    if (this.#limitReached() && this.result === null && !this._closing) return this.close();
    if (!this._endedP) throw new DwsError("start() first");
    await this._endedP;
    return this.#result();
  }

  async #waitBounded() {
    if (!(await this.#endedWithin(KILL_WAIT_MS))) {
      throw new DwsError(`dws (pid ${this.child.pid}) did not exit, even after SIGKILL`);
    }
    return this.#result();
  }

  #result() {
    if (this._spawnError) throw new BusError(`cannot run ${this.dws}: ${this._spawnError.message}`);
    if (this.result === null) {
      const code = this.child.exitCode ?? this.child.signalCode;
      const r = new ExitResult(code, this.stderrLines);
      if (r.malformed) this._error ??= new ContractError(r.malformed);
      if (this._error) {
        Object.assign(this._error, { result: r, code: r.code, error: r.error });
      } else if (this.#limitReached() && r.reason === "signal") {
        // The library stopped it at its maxEvents: what dws would have
        // said, had it counted (count: the events handed out).
        r.reason = "limit";
        r.count = this.handed;
        [r.action, r.why] = classify(r.code, r.reason, r.lostWithoutGoodbye);
      }
      this.result = r;
    }
    if (this._error) throw this._error;
    return this.result;
  }

  /** Stops the child (unless it already ended) and waits: with explicit
   * acks stdin is closed first (the acks written so far reach dws before
   * the EOF, which ends the run), then SIGTERM, then SIGKILL after
   * stopGraceMs. */
  async close() {
    if (!this.child) throw new DwsError("start() first");
    this._closing = true;
    if (!this.#exited()) {
      if (this.explicitAck) {
        this.stop("stdin");
        await this.#endedWithin(EOF_GRACE_MS);
      }
      await this.#terminate();
    }
    return this.#waitBounded();
  }
}

/** Starts `dws event consume KEYS... [flags]`; resolves once it is ready.
 *
 *     const c = await consume("demo.*", { ack: "explicit" });
 *     for await (const ev of c) { handle(ev.data); ev.ack(); }
 *     const result = await c.wait();
 */
async function consume(keys = [], options = {}) {
  const { dws, env, decodeData, onDiagnostic, readyTimeoutMs, stopGraceMs } = options;
  const c = new Consumer(consumeArgs(keys, options), { dws, env, decodeData, onDiagnostic, stopGraceMs });
  await c.start(readyTimeoutMs);
  return c;
}

/** Yields events across runs: after bus_shutdown it runs again at once (up
 * to `restarts` times; default no limit), retries exit 1 with backoff up to
 * `retries` times in a row; returns on limit/timeout/a stop, throws on every
 * other end. Breaking out stops the current child cleanly. */
async function* consumeForever(keys = [], options = {}) {
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
class Dws {
  constructor({ dws, profile, env, timeoutMs = 60000, stopGraceMs = STOP_GRACE_MS } = {}) {
    this.dws = findDws(dws);
    this.profile = profile;
    this.env = env;
    this.timeoutMs = timeoutMs;
    this.stopGraceMs = stopGraceMs;
  }

  /** Runs `dws event ARGS...` (with --profile); resolves with the JSON reply.
   * Its end is the exit of dws; one that did not answer within timeoutMs
   * gets SIGTERM (SIGKILL stopGraceMs later) and rejects with BusError. */
  run(args, input = "") {
    const argv = ["event", ...args, ...(this.profile ? ["--profile", this.profile] : [])];
    return new Promise((resolve, reject) => {
      const child = spawn(this.dws, argv, { env: this.env });
      const out = [[], []];
      const size = [0, 0];
      const timers = [];
      let late = false;
      const after = (ms, fn) => timers.push(setTimeout(fn, ms));
      const settle = (error) => {
        for (const t of timers) clearTimeout(t);
        if (error) return reject(new BusError(`cannot run ${this.dws}: ${error.message}`));
        if (late) return reject(new BusError(`${argv.slice(0, 3).join(" ")} did not answer within ${this.timeoutMs} ms`));
        const [stdout, stderr] = out.map((chunks) => Buffer.concat(chunks).toString("utf8"));
        try {
          resolve(reply(child.exitCode ?? child.signalCode, stdout, stderr));
        } catch (e) {
          reject(e);
        }
      };
      child.stdin.on("error", () => {});
      followChild(child, {
        onChunk: (i, chunk) => {
          if (size[i] < STDOUT_LINE_LIMIT) out[i].push(chunk); // a reply is far smaller
          size[i] += chunk.length;
        },
        done: settle,
      });
      after(this.timeoutMs, () => {
        if (child.exitCode !== null || child.signalCode !== null) return; // it answered
        late = true;
        child.kill("SIGTERM");
        after(this.stopGraceMs, () => child.kill("SIGKILL"));
        after(this.stopGraceMs + KILL_WAIT_MS, () => {
          child.stdout.destroy();
          child.stderr.destroy();
          reject(new BusError(`dws (pid ${child.pid}) did not exit, even after SIGKILL`));
        });
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
        ["--backoff", backoffArg(o.backoff)], ["--delivery", o.delivery],
        ["--where", o.where],
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
function reply(code, stdout, stderr) {
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

module.exports = {
  BusError,
  BusShutdownError,
  Consumer,
  ConsumerEndedError,
  ContractError,
  Dws,
  DwsError,
  EXITED_RE,
  Event,
  ExitResult,
  HaltedError,
  LOST_WITHOUT_GOODBYE,
  PermissionDeniedError,
  READY_RE,
  ReadyTimeoutError,
  STDERR_LINE_LIMIT,
  STDOUT_LINE_LIMIT,
  STOP_GRACE_MS,
  SourceLostError,
  UsageError,
  ackMode,
  backoffArg,
  classify,
  consume,
  consumeArgs,
  consumeForever,
  decodePayload,
  durationArg,
  errorForCode,
  findDws,
  parseEvent,
  parseExit,
  parseReady,
  reply,
  takeMaxEvents,
};
