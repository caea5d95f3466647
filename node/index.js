// dws-event-bus, the ES module entry (`import ... from "dws-event-bus"`):
// the same objects as the CommonJS entry index.cjs, where the code is, so a
// program that loads both gets one set of classes (instanceof holds).

import lib from "./index.cjs";

export const {
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
} = lib;
