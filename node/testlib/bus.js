// Test helper: a private bus per test (fresh DWS_CONFIG_DIR and
// XDG_RUNTIME_DIR, as the Rust harness does), dws from env DWS_BIN or PATH,
// and the bus stopped at the end.

import { mkdtempSync, mkdirSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Dws } from "../index.js";

export function privateBus(t) {
  const root = mkdtempSync(join(tmpdir(), "dwsnode"));
  mkdirSync(join(root, "cfg"));
  mkdirSync(join(root, "run"), { mode: 0o700 });
  const env = {
    ...process.env,
    DWS_CONFIG_DIR: join(root, "cfg"),
    XDG_RUNTIME_DIR: join(root, "run"),
  };
  delete env.DWS_PROFILE;
  const dws = new Dws({ env });
  t.after(async () => {
    const stopped = await dws.stop().catch(() => ({}));
    await gone(stopped.bus_pid);
    // A bus the test stopped itself may still be exiting (and writing):
    // each busd keeps its pid in its bus.lock.
    let profiles = [];
    try {
      profiles = readdirSync(join(root, "cfg", "events"));
    } catch {}
    for (const profile of profiles) {
      try {
        await gone(Number(readFileSync(join(root, "cfg", "events", profile, "bus.lock"), "utf8").trim().split(/\s+/)[0]));
      } catch {}
    }
    await remove(root);
  });
  return { env, dws, cfgDir: join(root, "cfg") };
}

/** Removes a test's directory, trying the whole removal again for a while
 * if something still wrote into it (rmSync's own retries only retry the
 * last rmdir). */
async function remove(root) {
  for (let i = 0; ; i++) {
    try {
      rmSync(root, { recursive: true, force: true });
      return;
    } catch (e) {
      if (i >= 200) throw e;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

/** Waits (bounded) until process pid has exited. */
async function gone(pid) {
  for (let i = 0; pid && i < 200; i++) {
    try {
      process.kill(pid, 0);
      // A zombie has exited; its new parent reaps it.
      if (readFileSync(`/proc/${pid}/stat`, "utf8").split(")").at(-1).trim().startsWith("Z")) return;
    } catch {
      return;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** The status row of subscription id. */
export async function sub(dws, id) {
  const rows = (await dws.status()).subscriptions.filter((s) => s.id === id);
  if (!rows.length) throw new Error(`${id} not listed`);
  return rows[0];
}
