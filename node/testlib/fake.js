// Test helper: fake `dws` programs, small /bin/sh scripts that break the
// consume contract on purpose, and the cleanup of what they leave running.

import { mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const READY = "[event] ready event_key=k bus_pid=1 subscribe_id=s";
export const exited = (count, secs, reason) =>
  `[event] exited \u2014 received ${count} event(s) in ${secs}s (reason: ${reason})`;
export const event = (seq, data) => `{"type":"event","seq":${seq},"event_type":"k","data":"${data}"}`;

/** make(body): the path of a /bin/sh program running body, which records
 * the pids it leaves running with `pid $$` (`pid $!` for a background job)
 * and sleeps with `$SLEEP SECS` (a sleep under the fake's directory, so
 * that its command line names it). After the test each recorded process
 * still running one of these is killed, and the directory removed. */
export function fakeDws(t) {
  const root = mkdtempSync(join(tmpdir(), "dwsfake"));
  const pids = join(root, "pids");
  const sleep = join(root, "sleep");
  symlinkSync(execFileSync("sh", ["-c", "command -v sleep"], { encoding: "utf8" }).trim(), sleep);
  let n = 0;
  t.after(() => {
    let words = [];
    try {
      words = readFileSync(pids, "utf8").split(/\s+/).filter(Boolean);
    } catch {}
    for (const pid of words) {
      try {
        if (readFileSync(`/proc/${pid}/cmdline`, "utf8").includes(root)) process.kill(Number(pid), "SIGKILL");
      } catch {}
    }
    rmSync(root, { recursive: true, force: true });
  });
  return (body) => {
    const path = join(root, `dws${n++}`);
    writeFileSync(path, `#!/bin/sh\nSLEEP='${sleep}'\npid() { echo "$1" >> '${pids}'; }\npid $$\n${body}\n`, {
      mode: 0o755,
    });
    return path;
  };
}
