//! A TCP proxy between a host and PostgreSQL that can fail the way a real
//! network does ([`Proxy`]): the fault suite's network nemesis and the
//! partition tests put one in front of each host (`Proxy::start(port)`, the
//! host's URL from [`Proxy::url`]) and then
//!
//! - **black-hole** both directions ([`Proxy::black_hole`]) or one
//!   ([`Proxy::hold`]): bytes are taken from the sender and kept, nothing is
//!   delivered, and no connection is closed or reset — the sender's TCP
//!   sees its data acknowledged and its keepalives answered (by the proxy's
//!   kernel), as behind a stuck middlebox or a half-open path, so only the
//!   application's own deadlines can notice. Connections opened meanwhile
//!   are accepted but not connected onward. [`Proxy::heal`] delivers what
//!   was kept, in order (a partition that ends before TCP gives up loses
//!   nothing), including a close that happened meanwhile;
//! - **reset** every proxied connection ([`Proxy::reset_all`]: `SO_LINGER`
//!   0, so both ends get an RST), as often as the nemesis calls it;
//! - **delay** every chunk by a base latency ± a jitter ([`Proxy::delay`]),
//!   keeping each direction's order.
//!
//! Plain threads, four per connection (a reader and a writer each way): a
//! reader never waits for its writer, so a held or delayed direction is
//! queued, never back-pressured. Dropping the proxy stops its listener and
//! closes every connection; nothing outlives it.

use std::{
    collections::HashMap,
    io::{Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::AsFd,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc, Condvar, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

/// A direction of a proxied connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Host → PostgreSQL.
    Up,
    /// PostgreSQL → host.
    Down,
}

/// The faults in force.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Faults {
    hold_up: bool,
    hold_down: bool,
    /// Base latency and jitter (± uniformly), per chunk.
    delay: Option<(Duration, Duration)>,
}

impl Faults {
    fn holds(&self, d: Direction) -> bool {
        match d {
            Direction::Up => self.hold_up,
            Direction::Down => self.hold_down,
        }
    }
}

struct Inner {
    target: SocketAddr,
    faults: Mutex<Faults>,
    changed: Condvar,
    stop: AtomicBool,
    /// Every live connection, for resets and the drop.
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    /// Jitter's random state (xorshift).
    rng: AtomicU64,
    accepted: AtomicU64,
}

/// One proxied connection's sockets (the threads use clones of them).
struct Conn {
    client: TcpStream,
    server: Mutex<Option<TcpStream>>,
    /// Reset: the threads end without a FIN, so the last close is an RST.
    reset: AtomicBool,
}

impl Conn {
    fn reset(&self) {
        self.reset.store(true, Ordering::SeqCst);
        reset(&self.client);
        if let Some(s) = lock(&self.server).as_ref() {
            reset(s);
        }
    }
}

/// One proxy: a loopback listener forwarding to `target`.
pub struct Proxy {
    inner: Arc<Inner>,
    addr: SocketAddr,
    listener: Option<thread::JoinHandle<()>>,
}

impl Proxy {
    /// A proxy on a free loopback port forwarding to `127.0.0.1:port`.
    pub fn start(port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let inner = Arc::new(Inner {
            target: SocketAddr::from(([127, 0, 0, 1], port)),
            faults: Mutex::new(Faults::default()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            rng: AtomicU64::new(0x9E37_79B9_7F4A_7C15 ^ u64::from(addr.port())),
            accepted: AtomicU64::new(0),
        });
        let i = inner.clone();
        let handle = thread::Builder::new()
            .name("proxy-accept".into())
            .spawn(move || accept_loop(&i, &listener))
            .expect("spawn the proxy's listener");
        Proxy {
            inner,
            addr,
            listener: Some(handle),
        }
    }

    /// The port hosts connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `url` (a `postgres://…@127.0.0.1:PORT/…` URL) pointed at this proxy.
    pub fn url(&self, url: &str) -> String {
        let (head, tail) = url.rsplit_once(':').expect("a URL with a port");
        let rest = tail.split_once('/').map_or("", |(_, r)| r);
        format!("{head}:{}/{rest}", self.port())
    }

    /// Keeps every byte in both directions from now on (see the module doc).
    pub fn black_hole(&self) {
        self.set(|f| {
            f.hold_up = true;
            f.hold_down = true;
        });
    }

    /// Keeps the bytes of one direction only.
    pub fn hold(&self, d: Direction) {
        self.set(|f| match d {
            Direction::Up => f.hold_up = true,
            Direction::Down => f.hold_down = true,
        });
    }

    /// Delays every chunk by `base` ± `jitter`.
    pub fn delay(&self, base: Duration, jitter: Duration) {
        self.set(|f| f.delay = Some((base, jitter.min(base))));
    }

    /// Ends every fault: what was kept is delivered, in order.
    pub fn heal(&self) {
        self.set(|f| *f = Faults::default());
    }

    /// Resets every connection proxied now (an RST to both ends); returns
    /// how many.
    pub fn reset_all(&self) -> usize {
        let conns = std::mem::take(&mut *lock(&self.inner.conns));
        for c in conns.values() {
            c.reset();
        }
        self.inner.changed.notify_all();
        conns.len()
    }

    /// How many connections the proxy accepted so far.
    pub fn accepted(&self) -> u64 {
        self.inner.accepted.load(Ordering::SeqCst)
    }

    fn set(&self, change: impl FnOnce(&mut Faults)) {
        change(&mut lock(&self.inner.faults));
        self.inner.changed.notify_all();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.heal();
        self.reset_all();
        if let Some(h) = self.listener.take() {
            let _ = h.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Makes the last close of `s` an RST (`SO_LINGER` 0) and wakes its
/// reader (a read shutdown sends nothing).
fn reset(s: &TcpStream) {
    let _ = nix::sys::socket::setsockopt(
        &s.as_fd(),
        nix::sys::socket::sockopt::Linger,
        &nix::libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    );
    let _ = s.shutdown(Shutdown::Read);
}

fn accept_loop(inner: &Arc<Inner>, listener: &TcpListener) {
    while !inner.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                let id = inner.accepted.fetch_add(1, Ordering::SeqCst);
                let i = inner.clone();
                let _ = thread::Builder::new()
                    .name("proxy-conn".into())
                    .spawn(move || serve(&i, id, client));
            }
            Err(_) => thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Connects onward (once no direction is held: a held path cannot open a
/// connection either) and runs the four threads of one connection.
fn serve(inner: &Arc<Inner>, id: u64, client: TcpStream) {
    let _ = client.set_nonblocking(false);
    let _ = client.set_nodelay(true);
    let Ok(c) = client.try_clone() else { return };
    let conn = Arc::new(Conn {
        client: c,
        server: Mutex::new(None),
        reset: AtomicBool::new(false),
    });
    lock(&inner.conns).insert(id, conn.clone());
    {
        let mut f = lock(&inner.faults);
        while (f.hold_up || f.hold_down) && !inner.stop.load(Ordering::SeqCst) {
            f = inner
                .changed
                .wait_timeout(f, Duration::from_millis(200))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
    // Reset (or dropped) while it waited.
    if conn.reset.load(Ordering::SeqCst) {
        return;
    }
    let Ok(server) = TcpStream::connect_timeout(&inner.target, Duration::from_secs(5)) else {
        conn.reset();
        lock(&inner.conns).remove(&id);
        return;
    };
    let _ = server.set_nodelay(true);
    match server.try_clone() {
        Ok(s) => *lock(&conn.server) = Some(s),
        Err(_) => {
            conn.reset();
            lock(&inner.conns).remove(&id);
            return;
        }
    }
    if conn.reset.load(Ordering::SeqCst) {
        conn.reset();
        return;
    }
    let pairs = [
        (client.try_clone(), server.try_clone(), Direction::Up),
        (server.try_clone(), client.try_clone(), Direction::Down),
    ];
    let mut threads = vec![];
    for (from, to, d) in pairs {
        let (Ok(from), Ok(to)) = (from, to) else {
            continue;
        };
        let (tx, rx) = mpsc::channel::<(Instant, Option<Vec<u8>>)>();
        let i = inner.clone();
        threads.push(thread::spawn(move || read_side(&i, from, tx)));
        let (i, c) = (inner.clone(), conn.clone());
        threads.push(thread::spawn(move || write_side(&i, &c, to, d, rx)));
    }
    for t in threads {
        let _ = t.join();
    }
    lock(&inner.conns).remove(&id);
}

/// Reads chunks and queues them with the time they are due (never earlier
/// than the chunk before); `None` marks the end.
fn read_side(inner: &Inner, mut from: TcpStream, tx: mpsc::Sender<(Instant, Option<Vec<u8>>)>) {
    let mut last = Instant::now();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf).unwrap_or(0);
        let delay = lock(&inner.faults).delay;
        let due = match delay {
            Some((base, jitter)) => {
                let r = xorshift(&inner.rng);
                let span = jitter.as_micros() as u64 * 2 + 1;
                let off = Duration::from_micros(r % span);
                Instant::now() + base - jitter + off
            }
            None => Instant::now(),
        };
        last = last.max(due);
        let chunk = (n > 0).then(|| buf[..n].to_vec());
        if tx.send((last, chunk)).is_err() || n == 0 {
            return;
        }
    }
}

/// Writes what its reader queued once it is due and its direction is not
/// held; at the end shuts the write side, so the peer sees the close.
fn write_side(
    inner: &Inner,
    conn: &Conn,
    mut to: TcpStream,
    d: Direction,
    rx: mpsc::Receiver<(Instant, Option<Vec<u8>>)>,
) {
    while let Ok((due, chunk)) = rx.recv() {
        let now = Instant::now();
        if due > now {
            thread::sleep(due - now);
        }
        let mut f = lock(&inner.faults);
        while f.holds(d) && !inner.stop.load(Ordering::SeqCst) && !conn.reset.load(Ordering::SeqCst)
        {
            f = inner
                .changed
                .wait_timeout(f, Duration::from_millis(200))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        drop(f);
        if conn.reset.load(Ordering::SeqCst) {
            return;
        }
        match chunk {
            Some(bytes) if to.write_all(&bytes).is_ok() => {}
            _ => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
        }
    }
}

fn xorshift(state: &AtomicU64) -> u64 {
    let mut x = state.load(Ordering::Relaxed);
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    state.store(x, Ordering::Relaxed);
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback; returns its port.
    fn echo() -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        thread::spawn(move || {
            for s in l.incoming().flatten() {
                thread::spawn(move || {
                    let mut r = s.try_clone().unwrap();
                    let mut w = s;
                    let _ = std::io::copy(&mut r, &mut w);
                });
            }
        });
        port
    }

    fn roundtrip(s: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
        s.write_all(msg).unwrap();
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got).unwrap();
        got
    }

    #[test]
    fn a_black_hole_keeps_bytes_until_healed_and_resets_close_both_ends() {
        let proxy = Proxy::start(echo());
        let mut s = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
        assert_eq!(roundtrip(&mut s, b"one"), b"one");
        proxy.black_hole();
        s.write_all(b"two").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buf = [0u8; 3];
        assert!(s.read(&mut buf).is_err(), "a black hole delivered");
        proxy.heal();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"two", "what was kept comes after the heal");
        proxy.hold(Direction::Down);
        s.write_all(b"3").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert!(s.read(&mut buf[..1]).is_err(), "held down, yet delivered");
        proxy.heal();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.read_exact(&mut buf[..1]).unwrap();
        proxy.delay(Duration::from_millis(200), Duration::from_millis(150));
        let t = Instant::now();
        assert_eq!(roundtrip(&mut s, b"late"), b"late");
        assert!(t.elapsed() >= Duration::from_millis(100), "no delay");
        proxy.heal();
        assert_eq!(proxy.reset_all(), 1);
        let r = s.read(&mut buf);
        assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    }
}
