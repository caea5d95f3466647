// The consumer against fake dws programs that break the contract (issue
// 36): each run must end within a bound, with a result or the library's
// typed error, never hang or throw an untyped error.
//
// The test timeout is a generous limit for a hang, not a measurement: a
// fixed run of these takes a few seconds (readyTimeoutMs and, for a dws
// that ignores SIGTERM, stopGraceMs are 1000).

import { test } from "node:test";
import assert from "node:assert/strict";
import { BusError, ContractError, Dws, ReadyTimeoutError, consume } from "../index.js";
import { READY, event, exited, fakeDws } from "../testlib/fake.js";

const BOUND = { timeout: 60000 };
// 1 s for a dws that ignores SIGTERM; for one that does not, a bound (it
// ends by SIGTERM, however loaded the machine).
const grace = (name) => (name.includes("ignores") ? 1000 : 30000);

// Row 13: a dws that will not stop, or closes its stdio and keeps running.
const NO_READY = {
  ignores_sigterm: "trap '' TERM\nexec $SLEEP 120",
  closes_stdio: "exec $SLEEP 120 <&- >&- 2>&-",
  closes_stdio_and_ignores_sigterm: "trap '' TERM\nexec $SLEEP 120 <&- >&- 2>&-",
};
// (the trap first: a SIGTERM right after the ready line must find it)
const AFTER_READY = {
  ignores_sigterm: `trap '' TERM\necho '${READY}' >&2\nexec $SLEEP 120`,
  closes_stdio_and_ignores_sigterm: `trap '' TERM\necho '${READY}' >&2\nexec $SLEEP 120 <&- >&- 2>&-`,
};

for (const [name, body] of Object.entries(NO_READY)) {
  test(`a stuck dws without a ready line is stopped, then killed (${name})`, BOUND, async (t) => {
    const dws = fakeDws(t)(body);
    await assert.rejects(consume("k", { dws, readyTimeoutMs: 1000, stopGraceMs: grace(name) }), (e) => {
      assert.ok(e instanceof ReadyTimeoutError, e.name);
      assert.equal(e.code, name.includes("ignores") ? "SIGKILL" : "SIGTERM");
      return true;
    });
  });
}

for (const [name, body] of Object.entries(AFTER_READY)) {
  test(`close kills a ready dws that ignores SIGTERM (${name})`, BOUND, async (t) => {
    const dws = fakeDws(t)(body);
    const c = await consume("k", { dws, stopGraceMs: 1000 });
    const r = await c.close();
    assert.deepEqual([r.code, r.reason, r.ok], ["SIGKILL", null, false]);
  });
}

// Row 14: tens of megabytes on stderr without a newline; an NDJSON line
// over the limit (64 MiB).
test("an over-long stderr line is drained and cut", BOUND, async (t) => {
  const dws = fakeDws(t)([
    `echo '${READY}' >&2`,
    "head -c 70000000 /dev/zero | tr '\\0' x >&2",
    "echo >&2",
    `echo '${event(1, "after")}'`,
    `echo '${exited(1, "0.500", "limit")}' >&2`,
  ].join("\n"));
  const c = await consume("k", { dws });
  const events = [];
  for await (const ev of c) events.push(ev.data);
  const r = await c.wait();
  assert.deepEqual([events, r.reason, r.count], [["after"], "limit", 1]);
  assert.ok(Math.max(...r.stderr.map((l) => l.length)) < 1 << 20);
  assert.ok(r.stderr.some((l) => l.startsWith("xxx") && l.includes("more bytes discarded")));
});

test("an NDJSON line over the limit is a ContractError and the run goes on", BOUND, async (t) => {
  const dws = fakeDws(t)([
    `echo '${READY}' >&2`,
    "head -c 68000000 /dev/zero | tr '\\0' x",
    "echo",
    `echo '${event(2, "next")}'`,
    `echo '${exited(2, "0.500", "limit")}' >&2`,
  ].join("\n"));
  const c = await consume("k", { dws });
  const it = c.events();
  await assert.rejects(it.next(), (e) => e instanceof ContractError && /68000000 bytes is over the limit/.test(e.message));
  const rest = [];
  for await (const ev of c) rest.push(ev.data);
  assert.deepEqual(rest, ["next"]);
  assert.equal((await c.wait()).reason, "limit");
});

// Row 15: malformed contract lines.
const exitsWith = (line) => `echo '${READY}' >&2\necho '${line}' >&2\nexit 0`;
const MALFORMED_END = {
  "seconds 1.2.3": exitsWith(exited(0, "1.2.3", "limit")),
  "count of 5000 digits": exitsWith(exited("9".repeat(5000), "0.500", "limit")),
  "halted seq of 5000 digits": exitsWith(
    `[event] subscription s halted at seq ${"9".repeat(5000)}: delivered 2 times without ack`),
};

for (const [name, body] of Object.entries(MALFORMED_END)) {
  test(`a malformed end of run is a ContractError (${name})`, BOUND, async (t) => {
    const dws = fakeDws(t)(body);
    const c = await consume("k", { dws });
    for await (const ev of c) assert.fail(`unexpected ${ev.seq}`);
    await assert.rejects(c.wait(), (e) => e instanceof ContractError && e.code === 0 && e.result !== null);
    await assert.rejects(c.close(), ContractError); // and again, the same
  });
}

test("a malformed ready line is a ContractError at once", BOUND, async (t) => {
  // A ready timeout far longer than the run takes: the error must not wait for it.
  const dws = fakeDws(t)(`echo '[event] ready event_key=k bus_pid=${"7".repeat(5000)} subscribe_id=s' >&2\nexec $SLEEP 120`);
  await assert.rejects(consume("k", { dws, readyTimeoutMs: 60000, stopGraceMs: 30000 }), (e) => {
    assert.ok(e instanceof ContractError, e.name);
    assert.match(e.message, /malformed ready line/);
    assert.equal(e.code, "SIGTERM"); // then stopped
    return true;
  });
});

// Row 16: the run ends when dws exits, though a grandchild holds its pipes.
test("the run ends at the exit though a grandchild holds the pipes", BOUND, async (t) => {
  const dws = fakeDws(t)([
    `echo '${READY}' >&2`,
    `echo '${event(1, "one")}'`,
    "$SLEEP 120 &",
    "pid $!",
    `echo '${event(2, "two")}'`,
    `echo '${exited(2, "0.100", "limit")}' >&2`,
    "exit 0",
  ].join("\n"));
  const c = await consume("k", { dws });
  const events = [];
  for await (const ev of c) events.push(ev.data);
  const r = await c.wait();
  assert.deepEqual([events, r.code, r.reason, r.count], [["one", "two"], 0, "limit", 2]);
});

// The verbs: the same end (the exit) and the same escalation.
test("a verb ends at its exit though a grandchild holds its pipes", BOUND, async (t) => {
  const dws = fakeDws(t)(`echo '{"running":true}'\n$SLEEP 120 &\npid $!\nexit 0`);
  assert.deepEqual(await new Dws({ dws, timeoutMs: 30000 }).status(), { running: true });
});

test("a verb that does not answer is stopped, then killed, after its timeout", BOUND, async (t) => {
  const dws = fakeDws(t)("trap '' TERM\nexec $SLEEP 120");
  await assert.rejects(new Dws({ dws, timeoutMs: 1000, stopGraceMs: 1000 }).status(), (e) => {
    assert.ok(e instanceof BusError, e.name);
    assert.match(e.message, /did not answer within 1000 ms/);
    return true;
  });
});

// Issue 49, row 6: the first stderr line is over the line limit (64 KiB),
// then dws stays silent: the start ends within readyTimeoutMs (plus the
// stop) with a typed error — ReadyTimeoutError when the line is not a
// ready line, ContractError when it is one, cut.
const SILENT_AFTER_LONG_LINE = {
  not_ready: ["head -c 100000 /dev/zero | tr '\\0' x >&2", "echo >&2", "exec $SLEEP 120"],
  ready_cut: ["printf '[event] ready ' >&2", "head -c 100000 /dev/zero | tr '\\0' x >&2", "echo >&2", "exec $SLEEP 120"],
};
for (const [name, body] of Object.entries(SILENT_AFTER_LONG_LINE)) {
  test(`an over-long first stderr line, then silence, ends the start (${name})`, BOUND, async (t) => {
    const dws = fakeDws(t)(body.join("\n"));
    const want = name === "not_ready" ? ReadyTimeoutError : ContractError;
    await assert.rejects(consume("k", { dws, readyTimeoutMs: 2000 }), (e) => {
      assert.ok(e instanceof want, e.name);
      return true;
    });
  });
}
