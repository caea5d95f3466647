// Types of the ES module entry of dws-event-bus (index.js): the same as
// the CommonJS entry's (index.d.cts), which index.js re-exports.

export * from "./index.cjs";
