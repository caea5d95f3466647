"""One `dws` child with piped stdin, stdout and stderr, for the sync and
the asyncio consumer alike. Nothing here ever waits without a bound:

- a waiter thread sees the exit; the end of a run is the exit of the
  process, not the end of its pipes: once it exited, what its stdout and
  stderr hold is read (what it wrote is all there by then) and they are
  closed, so a grandchild that inherited them cannot hold the run open;
- an I/O thread splits stdout and stderr into lines of at most a bound
  (the rest of an over-long line is read and discarded, and counted), so
  any amount of output is drained and never blocks the child;
- lines for stdin are queued and written by the I/O thread when the pipe
  takes them: `write` never blocks the caller;
- `stop` sends SIGTERM and, when the child has not exited within a grace
  period, SIGKILL.

Callbacks run on the I/O thread: `on_stdout` and `on_stderr` get the
lines of one read as (first `limit` bytes, bytes discarded) pairs,
`on_flushed` is called when every queued stdin byte was written (or
dropped), `on_end` once, after the exit and the last line.
"""

from __future__ import annotations

import fcntl
import os
import selectors
import signal
import struct
import subprocess
import sys
import termios
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple

STDOUT_LINE_LIMIT = 64 * 1024 * 1024
"""Longest NDJSON line kept: far above the bus's largest event (4 MiB
encoded, at most 6 times that as escaped JSON)."""
STDERR_LINE_LIMIT = 64 * 1024
"""Longest stderr line kept (dws's lines are far shorter); the rest of a
longer one is discarded."""
READ_SIZE = 256 * 1024

Line = Tuple[bytes, int]
LinesSink = Callable[[List[Line]], None]


class Lines:
    """Splits a byte stream into lines without ever holding more than
    `limit` bytes of one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buf = bytearray()
        self._cut = 0

    def feed(self, data: bytes) -> List[Line]:
        parts = data.split(b"\n")
        out: List[Line] = []
        for part in parts[:-1]:
            if not self._buf and not self._cut and len(part) <= self.limit:
                out.append((part, 0))  # a whole line of this read: no copy
                continue
            self._add(part)
            out.append(self._take())
        self._add(parts[-1])
        return out

    def end(self) -> List[Line]:
        """The last line, when the stream ended without a newline."""
        return [self._take()] if self._buf or self._cut else []

    def _add(self, part: bytes) -> None:
        room = self.limit - len(self._buf)
        if len(part) <= room:
            self._buf += part
        else:
            self._buf += part[:room]
            self._cut += len(part) - room

    def _take(self) -> Line:
        line = (bytes(self._buf), self._cut)
        self._buf.clear()
        self._cut = 0
        return line


def _pending(fd: int) -> int:
    """Bytes waiting in a pipe (FIONREAD)."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
    except OSError:
        return 1 << 20  # read what comes without blocking, up to this


def _report() -> None:
    """A callback raised: say so, and keep the I/O thread alive."""
    sys.excepthook(*sys.exc_info())  # type: ignore[arg-type]


class Child:
    """The child and its two threads (see the module's doc)."""

    def __init__(self, argv: Sequence[str], env: Optional[Dict[str, str]], *,
                 on_stdout: LinesSink, on_stderr: LinesSink, on_end: Callable[[], None],
                 on_flushed: Optional[Callable[[], None]] = None) -> None:
        self.argv = list(argv)
        self.env = env
        self.on_stdout = on_stdout
        self.on_stderr = on_stderr
        self.on_end = on_end
        self.on_flushed = on_flushed
        self.proc: Optional["subprocess.Popen[bytes]"] = None
        self.exited = threading.Event()
        self.ended = threading.Event()
        self._lock = threading.Lock()
        self._out = bytearray()  # for stdin, not yet written
        self._eof = False  # close stdin once _out is written
        self._stdin_open = False
        self._wake: Optional[Tuple[int, int]] = None

    # -- from any thread ---------------------------------------------------

    def start(self) -> None:
        """Spawns the child (raises OSError when it cannot be run)."""
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=self.env, bufsize=0)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            assert f is not None
            os.set_blocking(f.fileno(), False)
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._wake = (r, w)
        self._stdin_open = True
        threading.Thread(target=self._wait, name="dws-wait", daemon=True).start()
        threading.Thread(target=self._io, name="dws-io", daemon=True).start()

    @property
    def returncode(self) -> Optional[int]:
        return self.proc.returncode if self.exited.is_set() and self.proc is not None else None

    def write(self, data: bytes) -> None:
        """Queues bytes for stdin; never blocks. Dropped once stdin is
        closing or the child is gone."""
        with self._lock:
            if not self._stdin_open or self._eof:
                return
            if not self._out:
                try:
                    data = data[self._write_now(data):]
                except OSError:
                    self._out.clear()
                    self._eof = True
                    data = b""
            self._out += data
            self._poke()

    def unwritten(self) -> int:
        """Bytes queued for stdin and not yet written."""
        with self._lock:
            return len(self._out) if self._stdin_open else 0

    def close_stdin(self) -> None:
        """EOF on stdin once what is queued was written."""
        with self._lock:
            self._eof = True
            self._poke()

    def signal(self, sig: int) -> None:
        """Sends `sig` unless the child already exited."""
        if self.proc is not None and not self.exited.is_set():
            try:
                self.proc.send_signal(sig)
            except (ProcessLookupError, OSError):
                pass

    def stop(self, grace: float, kill_wait: float = 10.0) -> bool:
        """SIGTERM; SIGKILL when it did not exit within `grace` seconds.
        True once it exited (within `kill_wait` more seconds)."""
        self.signal(signal.SIGTERM)
        if self.exited.wait(grace):
            return True
        self.signal(signal.SIGKILL)
        return self.exited.wait(kill_wait)

    # -- internals (the lock is held where a name says _locked or noted) ---

    def _write_now(self, data: bytes) -> int:
        """Writes what stdin takes now (lock held); raises OSError when it
        is gone."""
        assert self.proc is not None and self.proc.stdin is not None
        try:
            return os.write(self.proc.stdin.fileno(), data)
        except BlockingIOError:
            return 0

    def _poke(self) -> None:
        """Wakes the I/O thread (lock held)."""
        if self._wake is not None:
            try:
                os.write(self._wake[1], b".")
            except OSError:
                pass  # full: it is awake anyway

    def _wait(self) -> None:
        assert self.proc is not None
        self.proc.wait()
        self.exited.set()
        with self._lock:
            self._poke()

    def _io(self) -> None:
        proc = self.proc
        assert proc is not None and self._wake is not None
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        stdin_fd = proc.stdin.fileno()
        streams = {
            proc.stdout.fileno(): (proc.stdout, Lines(STDOUT_LINE_LIMIT), self.on_stdout),
            proc.stderr.fileno(): (proc.stderr, Lines(STDERR_LINE_LIMIT), self.on_stderr),
        }
        sel = selectors.DefaultSelector()
        sel.register(self._wake[0], selectors.EVENT_READ)
        for fd in streams:
            sel.register(fd, selectors.EVENT_READ)
        writing = False
        try:
            while not self.exited.is_set():
                flushed = False
                with self._lock:
                    if self._stdin_open and self._eof and not self._out:
                        self._close_stdin_locked(sel)
                        writing = False
                    want = self._stdin_open and bool(self._out)
                if want and not writing:
                    sel.register(stdin_fd, selectors.EVENT_WRITE)
                elif writing and not want:
                    with self._lock:
                        if self._stdin_open:
                            sel.unregister(stdin_fd)
                writing = want
                for key, _ in sel.select():
                    if key.fd == self._wake[0]:
                        try:
                            os.read(key.fd, 4096)
                        except OSError:
                            pass
                    elif key.fd == stdin_fd:
                        flushed = self._flush_stdin(sel)
                        writing = writing and self._stdin_open
                    else:
                        self._read(key.fd, streams, sel, None)
                if flushed and self.on_flushed is not None:
                    self._call(self.on_flushed)
            # It exited: what its pipes hold now is the rest of the run.
            for fd in list(streams):
                self._read(fd, streams, sel, _pending(fd))
        finally:
            with self._lock:
                self._out.clear()
                if self._stdin_open:
                    self._close_stdin_locked(sel)
                for fd in list(streams):
                    self._close(fd, streams, sel)
                sel.close()
                os.close(self._wake[0])
                os.close(self._wake[1])
                self._wake = None
            if self.on_flushed is not None:
                self._call(self.on_flushed)
            self._call(self.on_end)
            self.ended.set()

    def _flush_stdin(self, sel: selectors.BaseSelector) -> bool:
        """Writes queued bytes; True when the queue became empty."""
        with self._lock:
            if not self._stdin_open or not self._out:
                return False
            try:
                del self._out[:self._write_now(bytes(self._out))]
            except OSError:  # it closed its stdin or exited: the acks are moot
                self._out.clear()
                self._close_stdin_locked(sel)
            return not self._out

    def _close_stdin_locked(self, sel: selectors.BaseSelector) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            sel.unregister(self.proc.stdin.fileno())
        except (KeyError, ValueError):
            pass
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self._stdin_open = False

    def _read(self, fd: int, streams: Dict[int, Tuple[object, Lines, LinesSink]],
              sel: selectors.BaseSelector, budget: Optional[int]) -> None:
        """Reads what `fd` has; with a `budget` (after the exit) at most
        that many bytes, then the stream is ended and closed."""
        if fd not in streams:
            return
        _, lines, sink = streams[fd]
        while True:
            try:
                data = os.read(fd, READ_SIZE if budget is None else max(1, min(budget, READ_SIZE)))
            except BlockingIOError:
                data = None
            except OSError:
                data = b""
            if data:
                self._call(sink, lines.feed(data))
                if budget is None:
                    return
                budget -= len(data)
                if budget > 0:
                    continue
            if data is None and budget is None:
                return
            break
        self._call(sink, lines.end())
        with self._lock:
            self._close(fd, streams, sel)

    @staticmethod
    def _close(fd: int, streams: Dict[int, Tuple[object, Lines, LinesSink]],
               sel: selectors.BaseSelector) -> None:
        f = streams.pop(fd, None)
        if f is None:
            return
        try:
            sel.unregister(fd)
        except (KeyError, ValueError):
            pass
        try:
            f[0].close()  # type: ignore[attr-defined]
        except OSError:
            pass

    @staticmethod
    def _call(fn: Callable[..., None], *args: object) -> None:
        if args and args[0] == []:
            return
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - a callback must not end the I/O thread
            _report()
