// The consumer against a real bus: events, stops, typed errors, explicit
// acks, poison, progress, and restarts after a crashed or stopped bus.

import { test } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { chmodSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import {
  BusError, BusShutdownError, HaltedError, PermissionDeniedError, UsageError, consume, consumeForever,
} from "../index.js";
import { privateBus, sub } from "../testlib/bus.js";

test("streams until the limit", async (t) => {
  const { env, dws } = privateBus(t);
  const c = await consume("ex.*", { env, maxEvents: 2, decodeData: true });
  assert.equal(c.ready.event_key, "ex.*");
  await dws.publish("ex.a", { n: 1 });
  await dws.publish("ex.b", "two");
  const events = [];
  for await (const ev of c) events.push(ev);
  const r = await c.wait();
  assert.deepEqual(events.map((e) => [e.event_type, e.data]), [["ex.a", { n: 1 }], ["ex.b", "two"]]);
  assert.equal(events[0].subscribe_id, c.ready.subscribe_id);
  assert.deepEqual([r.code, r.reason, r.count, r.action], [0, "limit", 2, "done"]);
});

for (const how of ["sigterm", "stdin"]) {
  test(`a stop by ${how} is clean and removes the owned subscription`, async (t) => {
    const { env, dws } = privateBus(t);
    const c = await consume(["ex.*"], { env });
    await dws.publish("ex.a", "1");
    for await (const ev of c) {
      assert.equal(ev.data, "1");
      c.stop(how);
    }
    const r = await c.wait();
    assert.deepEqual([r.code, r.reason, r.action], [0, "signal", "stopped"]);
    assert.deepEqual((await dws.status()).subscriptions, []);
  });
}

test("failures before ready are typed errors", async (t) => {
  const { env } = privateBus(t);
  await assert.rejects(consume("bad key!", { env }), (e) => {
    assert.ok(e instanceof UsageError);
    assert.equal(e.code, 2);
    assert.match(e.error, /bad key/);
    return true;
  });
  await assert.rejects(consume([], { env, subscribeId: "nosuch" }), (e) => e instanceof BusError && e.code === 1);
  await assert.rejects(consume("k", { env, dws: "/nonexistent/dws" }), BusError);
});

test("a secret others can read is PermissionDeniedError", async (t) => {
  const { env, cfgDir } = privateBus(t);
  const cfg = join(cfgDir, "config.toml");
  writeFileSync(cfg, '[profiles.default]\nsource = "dingtalk"\nclient_id = "x"\nclient_secret = "y"\n');
  chmodSync(cfg, 0o644);
  await assert.rejects(consume("ex.*", { env }), (e) => {
    assert.ok(e instanceof PermissionDeniedError, e.name);
    assert.equal(e.code, 3);
    assert.match(e.error, /chmod 600/);
    return true;
  });
});

test("bus_shutdown ends the run and check throws", async (t) => {
  const { env, dws } = privateBus(t);
  const c = await consume("ex.*", { env });
  await dws.stop();
  for await (const ev of c) assert.fail(`unexpected ${ev.seq}`);
  const r = await c.wait();
  assert.deepEqual([r.reason, r.lostWithoutGoodbye, r.action], ["bus_shutdown", false, "restart"]);
  assert.throws(() => r.check(), BusShutdownError);
});

test("explicit acks reach the bus before the close", async (t) => {
  const { env, dws } = privateBus(t);
  await dws.subscribe("ack.*", { id: "s1" });
  const c = await consume([], { env, subscribeId: "s1", ack: "explicit" });
  await dws.publish("ack.a", "1");
  await dws.publish("ack.a", "2");
  for await (const ev of c) {
    ev.ack();
    if (ev.data === "2") break;
  }
  assert.equal((await c.close()).reason, "signal");
  const s1 = await sub(dws, "s1");
  assert.deepEqual([s1.acked, s1.pending], [2, 0]);
});

test("nacks until the subscription halts, then an operator skips", async (t) => {
  const { env, dws } = privateBus(t);
  await dws.subscribe("poi.*", { id: "s2", maxDeliver: 2 });
  const c = await consume([], { env, subscribeId: "s2", ack: "explicit" });
  await dws.publish("poi.a", "bad");
  const deliveries = [];
  for await (const ev of c) {
    deliveries.push(ev.delivery);
    ev.nack();
  }
  const r = await c.wait();
  assert.deepEqual(deliveries, [1, 2]);
  assert.deepEqual([r.reason, r.action, r.haltedSeq], ["halted", "inspect-poison", 1]);
  assert.throws(() => r.check(), HaltedError);
  assert.equal((await dws.parked("s2")).state, "halted");
  assert.equal((await dws.skip("s2", { dryRun: true })).dry_run, true);
  assert.equal((await dws.skip("s2")).skipped_seq, 1);
  assert.equal((await dws.replayParked("s2")).replayed, 1);
});

test("progress keeps a slow event; term parks a hopeless one", async (t) => {
  const { env, dws } = privateBus(t);
  await dws.subscribe("slow.*", { id: "s3" });
  const c = await consume([], { env, subscribeId: "s3", ack: "explicit", ackWait: "1s" });
  await dws.publish("slow.a", "big");
  await dws.publish("slow.a", "never");
  const seen = [];
  for await (const ev of c) {
    seen.push(ev.data);
    if (ev.data === "big") {
      assert.ok((await c.keepAlive(() => sleep(2500), 200)) >= 1);
      ev.ack();
    } else {
      ev.term("can never succeed");
      break;
    }
  }
  await c.close();
  assert.deepEqual(seen, ["big", "never"], "nothing delivered twice");
  const s3 = await sub(dws, "s3");
  assert.deepEqual([s3.acked, s3.parked, s3.redelivered, s3.pending], [1, 1, 0, 0]);
  assert.equal((await dws.parked("s3")).parked_events[0].reason, "can never succeed");
});

test("consumeForever restarts after a crashed bus and resumes", async (t) => {
  const { env, dws } = privateBus(t);
  await dws.subscribe("cr.*", { id: "s1" });
  const readies = [];
  const got = [];
  const onReady = (r) => {
    readies.push(r);
    dws.publish("cr.a", `run ${readies.length}`);
  };
  for await (const ev of consumeForever([], { env, subscribeId: "s1", restarts: 1, onReady })) {
    got.push([ev.data, ev.redelivered]);
    if (got.length === 1) process.kill(readies[0].bus_pid, "SIGKILL");
    else if (ev.data === "run 2") break;
  }
  // At least once: the first event may come again, marked redelivered.
  assert.deepEqual(got[0], ["run 1", false]);
  assert.deepEqual(got.at(-1), ["run 2", false]);
  for (const g of got.slice(1, -1)) assert.deepEqual(g, ["run 1", true]);
  assert.notEqual(readies[0].bus_pid, readies[1].bus_pid);
  assert.equal((await sub(dws, "s1")).attached_pid, null);
});

test("maxEvents with explicit acks keeps the handler's acks", async (t) => {
  // The library counts maxEvents itself: dws stops only after the handler
  // of the last event returned and its ack (or term) was written.
  const { env, dws } = privateBus(t);
  await dws.subscribe("me.*", { id: "s5" });
  for (const n of ["0", "1", "2"]) await dws.publish("me.a", n);
  const c = await consume([], { env, subscribeId: "s5", ack: "explicit", maxEvents: 3 });
  for await (const ev of c) {
    await sleep(50); // a handler that takes its time
    if (ev.data === "2") ev.term("the last one: parked");
    else ev.ack();
  }
  const r = await c.wait();
  assert.deepEqual([r.code, r.reason, r.count, r.action], [0, "limit", 3, "done"]);
  const info = await dws.subscription("info", "s5");
  assert.deepEqual([info.pending, info.acked, info.parked, info.in_flight], [0, 2, 1, 0]);
  const listed = (await dws.run(["subscription", "list", "--format", "json"])).filter((s) => s.id === "s5");
  assert.deepEqual(listed.map((s) => s.pending), [0]);
});

test("two workers share a subscription, each event to one of them", async (t) => {
  const { env, dws } = privateBus(t);
  await dws.subscribe("jobs.*", { id: "work", delivery: "shared" });
  const a = await consume([], { env, subscribeId: "work", ack: "explicit", maxInFlight: 1 });
  const b = await consume([], { env, subscribeId: "work", ack: "explicit", maxInFlight: 1 });
  for (let i = 0; i < 6; i++) await dws.publish("jobs.x", { n: i });
  const got = { a: [], b: [] };
  let done;
  const all6 = new Promise((resolve) => (done = resolve));
  const take = async (name, c) => {
    for await (const ev of c) {
      got[name].push(ev.seq);
      ev.ack();
      if (got.a.length + got.b.length >= 6) done();
    }
  };
  const readers = Promise.all([take("a", a), take("b", b)]);
  await Promise.race([all6, sleep(20000)]);
  const row = await sub(dws, "work");
  assert.equal(row.delivery, "shared");
  assert.equal(row.consumers, 2);
  await a.close();
  await b.close();
  await readers;
  const seqs = [...got.a, ...got.b].sort((x, y) => x - y);
  assert.deepEqual(seqs, [1, 2, 3, 4, 5, 6]);
  assert.ok(got.a.length > 0 && got.b.length > 0, JSON.stringify(got));
});
