// The verbs (Dws) against a real bus: replies and typed errors.

import { test } from "node:test";
import assert from "node:assert/strict";
import { BusError, UsageError } from "../index.js";
import { privateBus } from "../testlib/bus.js";

test("publish is idempotent with an id", async (t) => {
  const { dws } = privateBus(t);
  const first = await dws.publish("demo.hello", { n: 1 }, { id: "e1" });
  const again = await dws.publish("demo.hello", { n: 1 }, { id: "e1" });
  assert.deepEqual([first.duplicate, again.duplicate, again.seq, first.event_id], [false, true, first.seq, "e1"]);
});

test("subscribe, status, verbs, unsubscribe and stop", async (t) => {
  const { dws } = privateBus(t);
  const spec = { id: "s1", ttl: 60, maxDeliver: 3, backoff: ["1s", "10s"] };
  const s = await dws.subscribe(["a.*", "b"], spec);
  assert.deepEqual([s.id, s.created, s.patterns], ["s1", true, ["a.*", "b"]]);
  assert.equal((await dws.subscribe(["a.*", "b"], spec)).created, false);
  const st = await dws.status();
  assert.equal(st.running, true);
  assert.deepEqual(st.subscriptions.map((x) => x.id), ["s1"]);
  assert.equal((await dws.disable("s1")).state, "disabled");
  assert.equal((await dws.enable("s1")).state, "active");
  assert.ok((await dws.seek("s1", "earliest")).seek.from_seq >= 0);
  await assert.rejects(dws.unsubscribe("s1", "nope"), (e) => {
    assert.ok(e instanceof BusError);
    assert.deepEqual(e.reply, { removed: ["s1"], not_found: ["nope"] });
    return true;
  });
  assert.equal((await dws.stop()).bus_stopping, true);
  assert.equal((await dws.status()).running, false);
});

test("verbs reject with typed errors", async (t) => {
  const { dws } = privateBus(t);
  await dws.subscribe("a.*", { id: "s1" });
  await assert.rejects(dws.skip("s1"), (e) => e instanceof BusError && /not halted/.test(e.error));
  await assert.rejects(dws.restart("nosuch"), BusError);
  await assert.rejects(dws.subscribe("bad key!"), (e) => e instanceof UsageError && e.code === 2);
  await assert.rejects(dws.subscription("no-such-verb", "s1"), UsageError);
});

test("backoff is a string, a duration or an array", async (t) => {
  const { dws } = privateBus(t);
  await dws.subscribe("a.*", { id: "s1", backoff: "1s" });
  await dws.subscribe("a.*", { id: "s2", backoff: "1s,1m" });
  await dws.subscribe("a.*", { id: "s3", backoff: 2 });
  await dws.subscribe("a.*", { id: "s4", backoff: ["1s", 60] });
  const got = [];
  for (const id of ["s1", "s2", "s3", "s4"]) got.push((await dws.subscription("info", id)).backoff_ms);
  assert.deepEqual(got, [[1000], [1000, 60000], [2000], [1000, 60000]]);
});
