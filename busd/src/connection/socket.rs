//! A connection's socket, watched for readability only.
//!
//! tokio registers a `UnixStream` for reading and writing at once, so every
//! time the peer reads what the bus wrote, the kernel reports the socket
//! writable again and wakes the bus's thread for nothing: at a fixed rate,
//! one wasted wake-up of the whole bus per consumer per event. Here the
//! socket is registered for reading only ([`Reader`]); the [`Writer`]
//! writes without asking first, and registers a second descriptor of the
//! same socket for writability only while a write waits for room (a
//! consumer that does not keep up), dropping it once a write goes through
//! whole.

use std::{
    io::{self, IoSlice, Write},
    net::Shutdown,
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::net::UnixStream,
    },
};

use bytes::{BufMut, BytesMut};
use tokio::io::{unix::AsyncFd, Interest};

/// The read side: registered for readability only.
pub(super) struct Reader {
    fd: AsyncFd<UnixStream>,
}

/// The write side: a second descriptor of the same socket.
pub(super) struct Writer {
    stream: Option<UnixStream>,
    /// The same descriptor, registered for writability while a write
    /// waits for room.
    waiting: Option<AsyncFd<UnixStream>>,
}

/// Splits `stream` into its read and write sides.
pub(super) fn split(stream: tokio::net::UnixStream) -> io::Result<(Reader, Writer)> {
    let std = stream.into_std()?;
    let writer = std.try_clone()?;
    // SAFETY: the `UnixStream` owns its descriptor, open until the
    // `AsyncFd` (which owns the stream) drops or gives it back.
    let fd = unsafe { AsyncFd::register_with_interest(std, Interest::READABLE) }
        .map_err(|e| e.into_parts().1)?;
    Ok((
        Reader { fd },
        Writer {
            stream: Some(writer),
            waiting: None,
        },
    ))
}

impl Reader {
    /// Reads what is there into `buf`'s spare capacity (at least 4 KiB of
    /// it, reserved here); `Ok(0)` at the end of the stream.
    pub(super) async fn read_buf(&self, buf: &mut BytesMut) -> io::Result<usize> {
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(4096);
        }
        loop {
            let mut ready = self.fd.readable().await?;
            match ready.try_io(|fd| recv_into(fd.get_ref(), buf)) {
                Ok(res) => return res,
                Err(_would_block) => continue,
            }
        }
    }

    /// Reads and drops what is there; `Ok(0)` at the end of the stream.
    pub(super) async fn discard(&self) -> io::Result<usize> {
        let mut scratch = BytesMut::with_capacity(16 * 1024);
        self.read_buf(&mut scratch).await
    }
}

/// One `sendmsg` of `iov` with `fd` passed along (SCM_RIGHTS).
fn send_with_fd(s: &UnixStream, iov: &[IoSlice<'_>], fd: &OwnedFd) -> io::Result<usize> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let fds = [fd.as_raw_fd()];
    sendmsg::<()>(
        s.as_raw_fd(),
        iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(io::Error::from)
}

/// One `recv` into the spare capacity of `buf`.
fn recv_into(s: &UnixStream, buf: &mut BytesMut) -> io::Result<usize> {
    let spare = buf.chunk_mut();
    let len = spare.len();
    let ptr = spare.as_mut_ptr();
    // SAFETY: `ptr` and `len` describe `buf`'s spare capacity, which stays
    // borrowed (and allocated) for the whole call; the kernel writes at
    // most `len` bytes there.
    let n = unsafe { nix::libc::recv(s.as_raw_fd(), ptr.cast(), len, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    // SAFETY: the kernel initialized the first `n <= len` bytes.
    unsafe { buf.advance_mut(n) };
    Ok(n)
}

impl Writer {
    /// One vectored write; waits for room when the socket has none. `fd`
    /// goes with it (SCM_RIGHTS), when given. Cancel-safe: nothing is
    /// written unless it returns `Ok`.
    pub(super) async fn write_vectored(
        &mut self,
        iov: &[IoSlice<'_>],
        fd: Option<&OwnedFd>,
    ) -> io::Result<usize> {
        let total: usize = iov.iter().map(|b| b.len()).sum();
        loop {
            let s = match (&self.stream, &self.waiting) {
                (Some(s), _) => s,
                (None, Some(w)) => w.get_ref(),
                (None, None) => return Err(io::ErrorKind::NotConnected.into()),
            };
            let res = match fd {
                None => (&*s).write_vectored(iov),
                Some(fd) => send_with_fd(s, iov, fd),
            };
            match res {
                Ok(n) => {
                    if n == total {
                        self.unregister();
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.register()?;
                    if let Some(w) = &self.waiting {
                        w.writable().await?.clear_ready();
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Shuts the write direction down (the peer reads the end of stream).
    pub(super) fn shutdown(&self) -> io::Result<()> {
        match (&self.stream, &self.waiting) {
            (Some(s), _) => s.shutdown(Shutdown::Write),
            (None, Some(w)) => w.get_ref().shutdown(Shutdown::Write),
            (None, None) => Ok(()),
        }
    }

    fn register(&mut self) -> io::Result<()> {
        if let Some(s) = self.stream.take() {
            // SAFETY: as in `split`: the stream owns its descriptor.
            match unsafe { AsyncFd::register_with_interest(s, Interest::WRITABLE) } {
                Ok(fd) => self.waiting = Some(fd),
                Err(e) => {
                    let (s, e) = e.into_parts();
                    self.stream = Some(s);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn unregister(&mut self) {
        if let Some(w) = self.waiting.take() {
            self.stream = Some(w.into_inner());
        }
    }
}
