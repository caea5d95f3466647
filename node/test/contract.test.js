// The pure parts of the contract, without a bus.

import { test } from "node:test";
import assert from "node:assert/strict";
import {
  BusError, BusShutdownError, ContractError, DwsError, ExitResult, HaltedError, PermissionDeniedError,
  SourceLostError, UsageError, ackMode, classify, consumeArgs, durationArg, parseEvent, parseExit,
  parseReady, takeMaxEvents,
} from "../index.js";

const exited = (r) => `[event] exited \u2014 received 3 event(s) in 2.004s (reason: ${r})`;

test("the ready line is parsed", () => {
  assert.deepEqual(parseReady("[event] ready event_key=a.*,b bus_pid=42 subscribe_id=sub-42-1"), {
    event_key: "a.*,b", bus_pid: 42, subscribe_id: "sub-42-1",
  });
  assert.equal(parseReady("[event] ready"), null);
});

test("exit lines make the result", () => {
  const r = new ExitResult(0, [exited("limit")]);
  assert.deepEqual([r.code, r.reason, r.count, r.seconds, r.action, r.ok], [0, "limit", 3, 2.004, "done", true]);
  assert.equal(r.check(), r);
  const u = new ExitResult(2, ["Error: invalid event key"]);
  assert.deepEqual([u.reason, u.error, u.action], [null, "invalid event key", "fix-usage"]);
});

test("check throws the typed error", () => {
  const cases = [
    [2, ["Error: bad"], UsageError],
    [1, ["Error: not found"], BusError],
    [3, ["Error: secret readable"], PermissionDeniedError],
    [0, [exited("bus_shutdown")], BusShutdownError],
    [0, [exited("source_lost")], SourceLostError],
    [0, ["[event] subscription s halted at seq 7: delivered 2 times without ack", exited("halted")], HaltedError],
    ["SIGKILL", [], DwsError],
  ];
  for (const [code, lines, cls] of cases) {
    assert.throws(() => new ExitResult(code, lines).check(), (e) => {
      assert.ok(e instanceof cls, `${code} ${e.name}`);
      assert.equal(e.code, code);
      return true;
    });
  }
  assert.equal(new ExitResult(0, ["[event] subscription s halted at seq 7: x", exited("halted")]).haltedSeq, 7);
});

test("actions match the README table", () => {
  assert.equal(classify(0, "bus_shutdown", true)[0], "restart");
  assert.equal(classify(0, "signal", false)[0], "stopped");
  assert.equal(classify(0, "taken_over", false)[0], "done");
  assert.equal(classify(0, "stopped", false)[0], "done");
  assert.equal(classify(0, "halted", false)[0], "inspect-poison");
  assert.equal(classify(0, "newer", false)[0], "inspect");
  assert.equal(classify(1, null, false)[0], "retry");
});

test("event lines keep known and unknown fields", () => {
  const line =
    '{"type":"event","seq":2,"event_id":"e","event_type":"a.b","data":"{\\"n\\":2}",' +
    '"headers":{"h":"v"},"redelivered":true,"delivery":2,"later":1}';
  const ev = parseEvent(line);
  assert.deepEqual([ev.seq, ev.type, ev.data, ev.json(), ev.headers, ev.delivery, ev.redelivered, ev.later],
    [2, "a.b", '{"n":2}', { n: 2 }, { h: "v" }, 2, true, 1]);
  assert.deepEqual(parseEvent(line, true).data, { n: 2 });
  assert.equal(parseEvent('{"seq":1,"event_type":"t","data":"text"}', true).data, "text");
  // A dws that sends data as an object (e.g. a later `--data json`) works too.
  assert.deepEqual(parseEvent('{"seq":1,"event_type":"t","data":{"a":1}}').json(), { a: 1 });
  assert.equal(parseEvent("not json"), null);
  assert.equal(parseEvent("[1]"), null);
  assert.throws(() => ev.ack(), DwsError);
});

test("options build the command line", () => {
  const args = consumeArgs(["a.*", "b"], {
    from: "earliest", maxEvents: 3, ack: "explicit", ackWait: 1.5, backoff: ["1s", 60],
    takeover: true, extraArgs: ["--filter-json", "{}"],
  });
  assert.deepEqual(args, ["a.*", "b", "--from", "earliest", "--max-events", "3", "--ack", "explicit",
    "--ack-wait", "1500ms", "--backoff", "1s,60000ms", "--takeover", "--filter-json", "{}"]);
  assert.equal(ackMode(args), "explicit");
  assert.deepEqual(consumeArgs("k"), ["k"]);
  assert.throws(() => durationArg(-1), RangeError);
});

test("malformed contract lines are ContractErrors", () => {
  for (const line of [
    `[event] ready event_key=k bus_pid=${"7".repeat(5000)} subscribe_id=s`,
    "[event] ready event_key=k bus_pid=x subscribe_id=s",
  ]) {
    assert.throws(() => parseReady(line), ContractError);
  }
  for (const line of [
    exited("limit").replace("2.004", "1.2.3"),
    exited("limit").replace("3", "9".repeat(5000)),
    `${exited("limit")} ...(5 more bytes discarded)`,
    `[event] subscription s halted at seq ${"9".repeat(5000)}: x`,
  ]) {
    assert.throws(() => parseExit(0, ["Error: first", line]), (e) => {
      assert.ok(e instanceof ContractError, line.slice(0, 40));
      assert.equal(e.result.error, "first");
      return true;
    });
  }
  assert.equal(parseExit(0, [exited("limit")]).reason, "limit");
});

test("backoff and maxEvents on the command line", () => {
  assert.deepEqual(consumeArgs("k", { backoff: "1s" }), ["k", "--backoff", "1s"]);
  assert.deepEqual(consumeArgs("k", { backoff: 1.5 }), ["k", "--backoff", "1500ms"]);
  assert.deepEqual(consumeArgs("k", { backoff: [] }), ["k"]);
  assert.deepEqual(takeMaxEvents(["k", "--max-events", "3", "--ack=explicit"]), [3, ["k", "--ack=explicit"]]);
  assert.deepEqual(takeMaxEvents(["k", "--max-events=2"]), [2, ["k"]]);
  // What dws would refuse stays for dws to say so.
  assert.deepEqual(takeMaxEvents(["k", "--max-events", "0"]), [null, ["k", "--max-events", "0"]]);
});
