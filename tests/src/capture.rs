//! The background readers of a child's pipes: a thread per pipe appends
//! what it reads to a shared buffer, so a test can block on "this line
//! appeared" while the process runs on, and no pipe fills up and stalls
//! the process under test.

use std::{
    io::Read,
    sync::{Arc, Condvar, Mutex},
    thread,
    time::Instant,
};

#[derive(Default)]
struct Stream {
    buf: Vec<u8>,
    /// No more bytes will come: EOF, read error, or closed by the test.
    done: bool,
}

/// What one pipe delivered so far, shared with its reader thread.
#[derive(Clone)]
pub(crate) struct Capture(Arc<(Mutex<Stream>, Condvar)>);

impl Capture {
    /// A capture with nothing in it and nothing to come (the stderr of a
    /// process whose stderr goes to its stdout).
    pub(crate) fn finished() -> Capture {
        Capture(Arc::new((
            Mutex::new(Stream {
                buf: Vec::new(),
                done: true,
            }),
            Condvar::new(),
        )))
    }

    /// Reads `r` on a thread of its own until EOF, or until it holds
    /// `close_after_lines` complete lines: then the read end is closed
    /// (the `| head -n N` case; `Some(0)` closes it without reading).
    pub(crate) fn spawn<R: Read + Send + 'static>(
        mut r: R,
        close_after_lines: Option<usize>,
    ) -> Capture {
        let cap = Capture(Arc::new((Mutex::new(Stream::default()), Condvar::new())));
        let shared = cap.clone();
        thread::spawn(move || {
            let mut chunk = vec![0u8; 64 * 1024];
            let mut loop_open = close_after_lines != Some(0);
            if !loop_open {
                let (lock, cv) = &*shared.0;
                lock.lock().unwrap_or_else(|e| e.into_inner()).done = true;
                cv.notify_all();
            }
            while loop_open {
                let n = match r.read(&mut chunk) {
                    Ok(0) | Err(_) => 0,
                    Ok(n) => n,
                };
                let (lock, cv) = &*shared.0;
                let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
                s.buf.extend_from_slice(&chunk[..n]);
                let enough = close_after_lines
                    .is_some_and(|want| s.buf.iter().filter(|b| **b == b'\n').count() >= want);
                if n == 0 || enough {
                    s.done = true;
                    loop_open = false;
                }
                cv.notify_all();
            }
            // Dropping `r` here closes our read end (the `| head` case).
            drop(r);
        });
        cap
    }

    /// Everything read so far, lossily decoded.
    pub(crate) fn text(&self) -> String {
        let s = self.0 .0.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&s.buf).into_owned()
    }

    /// The complete lines read so far (a last line without `\n` is not),
    /// split as [`str::lines`] does.
    pub(crate) fn lines_so_far(&self) -> Vec<String> {
        let text = self.text();
        let complete = text.rfind('\n').map_or("", |i| &text[..i]);
        complete.lines().map(str::to_owned).collect()
    }

    pub(crate) fn is_done(&self) -> bool {
        self.0 .0.lock().unwrap_or_else(|e| e.into_inner()).done
    }

    /// Blocks until `f(complete lines, done)` returns `Some`, or the
    /// deadline. `Err(true)`: the pipe closed first; `Err(false)`: timed out.
    pub(crate) fn wait_for<T>(
        &self,
        deadline: Instant,
        mut f: impl FnMut(&[&str], bool) -> Option<T>,
    ) -> Result<T, bool> {
        let (lock, cv) = &*self.0;
        let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let text = String::from_utf8_lossy(&s.buf);
            if let Some(v) = f(&complete_lines(&text), s.done) {
                return Ok(v);
            }
            if s.done {
                return Err(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(false);
            }
            s = cv
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// The `\n`-terminated lines of `text`, without their `\n`; a last line
/// still being written (no `\n` yet) is left out. Empty lines count.
pub(crate) fn complete_lines(text: &str) -> Vec<&str> {
    match text.rfind('\n') {
        Some(i) => text[..i].split('\n').collect(),
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_terminated_lines_are_complete() {
        assert_eq!(complete_lines(""), Vec::<&str>::new());
        assert_eq!(complete_lines("partial"), Vec::<&str>::new());
        assert_eq!(complete_lines("a\n"), vec!["a"]);
        assert_eq!(complete_lines("a\nb"), vec!["a"]);
        assert_eq!(complete_lines("a\nb\n"), vec!["a", "b"]);
        assert_eq!(complete_lines("\n"), vec![""]);
        assert_eq!(complete_lines("\n\nx"), vec!["", ""]);
    }

    #[test]
    fn a_capture_closes_after_the_lines_it_was_asked_for() {
        let cap = Capture::spawn(&b"one\ntwo\nthree\n"[..], Some(2));
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        assert_eq!(cap.wait_for(deadline, |_, done| done.then_some(())), Ok(()));
        assert!(cap.lines_so_far().len() >= 2);
        let none = Capture::spawn(&b"x\n"[..], Some(0));
        assert_eq!(
            none.wait_for(deadline, |_, done| done.then_some(())),
            Ok(())
        );
        assert_eq!(none.text(), "");
        let all = Capture::spawn(&b"a\nb"[..], None);
        assert_eq!(
            all.wait_for(deadline, |l, done| done.then_some(l.len())),
            Ok(1)
        );
        assert_eq!(all.lines_so_far(), vec!["a".to_string()]);
        assert_eq!(all.text(), "a\nb");
    }
}
