// The package as a user's project loads it: by name, from a CommonJS
// project (require) and from an ES module one (import), one set of objects.

import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const pkg = join(dirname(fileURLToPath(import.meta.url)), "..");

// Node 20.19+ and 22.12+ can require() an ES module; 18 and earlier 20s
// cannot, which is what a CommonJS entry is for: test as they would run.
const noRequireEsm = process.allowedNodeEnvironmentFlags.has("--experimental-require-module")
  ? ["--no-experimental-require-module"]
  : [];

function project(t, type) {
  const root = mkdtempSync(join(tmpdir(), "dwspkg"));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  mkdirSync(join(root, "node_modules"));
  symlinkSync(pkg, join(root, "node_modules", "dws-event-bus"));
  writeFileSync(join(root, "package.json"), JSON.stringify({ name: "user", private: true, type }));
  return root;
}

test("a CommonJS project requires the package by name", (t) => {
  const root = project(t, "commonjs");
  writeFileSync(join(root, "main.js"), [
    'const bus = require("dws-event-bus");',
    'const { consume, Dws, DwsError, ContractError } = bus;',
    'if (typeof consume !== "function" || typeof Dws !== "function") throw new Error("no consume");',
    'if (!(new ContractError("x") instanceof DwsError)) throw new Error("classes");',
    'import("dws-event-bus").then((esm) => {',
    '  if (esm.consume !== consume || esm.DwsError !== DwsError) throw new Error("two copies");',
    '  console.log(Object.keys(bus).length === Object.keys(esm).length ? "same" : "differ");',
    '});',
  ].join("\n"));
  const out = execFileSync(process.execPath, [...noRequireEsm, "main.js"], { cwd: root, encoding: "utf8" });
  assert.equal(out.trim(), "same");
});

test("an ES module project imports the package by name", (t) => {
  const root = project(t, "module");
  writeFileSync(join(root, "main.js"), [
    'import { consume, parseReady } from "dws-event-bus";',
    'console.log(typeof consume, parseReady("[event] ready event_key=k bus_pid=1 subscribe_id=s").bus_pid);',
  ].join("\n"));
  const out = execFileSync(process.execPath, ["main.js"], { cwd: root, encoding: "utf8" });
  assert.equal(out.trim(), "function 1");
});
