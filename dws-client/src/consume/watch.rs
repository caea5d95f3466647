//! What a run watches besides the bus: SIGTERM and SIGINT ([`Signals`]),
//! the end of stdin ([`watch_stdin_eof`]), a stdout whose reader has gone
//! ([`watch_stdout_close`]) and, with `--ack explicit`, the ack lines on
//! stdin ([`recv_line`]), each turned into an Ack frame by [`settle`]
//! (pure, unit-tested). Each optional watch is a future that stays pending
//! forever when there is nothing to watch, so it can sit in a `select!`.

use std::{
    collections::BTreeSet,
    io,
    os::fd::{AsFd, OwnedFd},
};

use proto::v1;
use tokio::{
    io::{unix::AsyncFd, Interest},
    signal::unix::{signal, Signal, SignalKind},
    sync::{mpsc, oneshot},
};

use crate::{
    acks::{AckLine, Input},
    exit::{CliError, Result},
};

/// SIGTERM and SIGINT, watched from the start of a run: both end it.
pub(super) struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    pub(super) fn watch() -> Result<Signals> {
        let watch = |kind| {
            signal(kind).map_err(|e| CliError::runtime(format!("cannot watch signals: {e}")))
        };
        Ok(Signals {
            term: watch(SignalKind::terminate())?,
            int: watch(SignalKind::interrupt())?,
        })
    }

    /// Resolves at the next SIGTERM or SIGINT. Cancel-safe.
    pub(super) async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// Resolves when stdin reaches EOF (or fails). Reads on a plain thread, which
/// the process abandons at exit, so a stdin that never ends costs nothing.
pub(super) fn watch_stdin_eof() -> oneshot::Receiver<()> {
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        let mut stdin = io::stdin().lock();
        loop {
            match io::Read::read(&mut stdin, &mut buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let _ = tx.send(());
    });
    rx
}

/// The end of stdin, from [`watch_stdin_eof`]; pending forever without one.
pub(super) async fn recv_opt(rx: &mut Option<oneshot::Receiver<()>>) {
    match rx {
        Some(r) => {
            let _ = r.await;
        }
        None => std::future::pending().await,
    }
}

/// Watches stdout for the error condition a pipe reports once its reader
/// has gone (EPOLLERR), so a consumer whose reader died ends now (reason
/// `signal`) instead of at its next event. `None` when stdout cannot be
/// watched (a regular file or a terminal).
pub(super) fn watch_stdout_close() -> Option<AsyncFd<OwnedFd>> {
    let fd = io::stdout().as_fd().try_clone_to_owned().ok()?;
    // SAFETY: `fd` is an open descriptor owned by the AsyncFd for its whole
    // life; OwnedFd always returns that same descriptor.
    unsafe { AsyncFd::register_with_interest(fd, Interest::ERROR) }.ok()
}

/// Resolves when the watched stdout reports its reader gone; pending
/// forever when it is not watched.
pub(super) async fn stdout_closed(watch: Option<&AsyncFd<OwnedFd>>) {
    match watch {
        Some(w) => {
            let _ = w.ready(Interest::ERROR).await;
        }
        None => std::future::pending().await,
    }
}

/// The next line from the explicit-ack reader; pending forever without one.
pub(super) async fn recv_line(rx: &mut Option<mpsc::Receiver<Input>>) -> Option<Input> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

/// Turns one explicit-ack line into an Ack frame for the events this run
/// delivered (`delivered` shrinks by what is settled).
pub(super) fn settle(
    text: &str,
    delivered: &mut BTreeSet<u64>,
) -> std::result::Result<v1::Ack, String> {
    let line = crate::acks::parse(text)?;
    let not_ours = |seq: u64| format!("seq {seq} was not delivered to this run (or is settled)");
    let mut ack = v1::Ack::default();
    match line {
        AckLine::Ack(seq) => {
            if !delivered.remove(&seq) {
                return Err(not_ours(seq));
            }
            ack.seqs.push(seq);
        }
        AckLine::AckUpto(seq) => {
            let upto: Vec<u64> = delivered.range(..=seq).copied().collect();
            if upto.is_empty() {
                return Err(not_ours(seq));
            }
            for s in &upto {
                delivered.remove(s);
            }
            ack.seqs = upto;
        }
        AckLine::Nack(seq, delay) => {
            if !delivered.remove(&seq) {
                return Err(not_ours(seq));
            }
            ack.nacks.push(v1::Nack {
                seq,
                delay_ms: delay.as_millis() as u64,
            });
        }
        // Still ours afterwards: it can be acked, nacked or termed later.
        AckLine::Progress(seq) => {
            if !delivered.contains(&seq) {
                return Err(not_ours(seq));
            }
            ack.progress.push(seq);
        }
        AckLine::Term(seq, reason) => {
            if !delivered.remove(&seq) {
                return Err(not_ours(seq));
            }
            ack.terms.push(v1::Term { seq, reason });
        }
    }
    Ok(ack)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivered(seqs: &[u64]) -> BTreeSet<u64> {
        seqs.iter().copied().collect()
    }

    fn not_ours(seq: u64) -> String {
        format!("seq {seq} was not delivered to this run (or is settled)")
    }

    #[test]
    fn ack_settles_one_delivered_event() {
        let mut d = delivered(&[3, 5, 9]);
        let ack = settle("ack 5", &mut d).unwrap();
        assert_eq!(ack.seqs, [5]);
        assert!(ack.nacks.is_empty());
        assert_eq!(ack.seq, 0, "explicit acks are never cumulative");
        assert_eq!(d, delivered(&[3, 9]));
    }

    #[test]
    fn ack_upto_settles_every_delivered_event_at_or_below() {
        let mut d = delivered(&[3, 5, 9]);
        let ack = settle("ack-upto 6", &mut d).unwrap();
        assert_eq!(ack.seqs, [3, 5]);
        assert_eq!(d, delivered(&[9]));
        let ack = settle("ack-upto 9", &mut d).unwrap();
        assert_eq!(ack.seqs, [9]);
        assert!(d.is_empty());
    }

    #[test]
    fn nack_settles_with_its_delay() {
        let mut d = delivered(&[4, 7]);
        let ack = settle("nack 7 2s", &mut d).unwrap();
        assert!(ack.seqs.is_empty());
        assert_eq!(ack.nacks.len(), 1);
        assert_eq!((ack.nacks[0].seq, ack.nacks[0].delay_ms), (7, 2000));
        let ack = settle("nack 4", &mut d).unwrap();
        assert_eq!((ack.nacks[0].seq, ack.nacks[0].delay_ms), (4, 0));
        assert!(d.is_empty());
    }

    #[test]
    fn progress_keeps_the_event_and_term_settles_it_with_its_reason() {
        let mut d = delivered(&[4, 7]);
        let ack = settle("progress 7", &mut d).unwrap();
        assert_eq!(ack.progress, [7]);
        assert!(ack.seqs.is_empty() && ack.nacks.is_empty() && ack.terms.is_empty());
        assert_eq!(settle("progress 7", &mut d).unwrap().progress, [7]);
        assert_eq!(d, delivered(&[4, 7]));
        let ack = settle("term 7 schema mismatch", &mut d).unwrap();
        assert_eq!(
            (ack.terms[0].seq, ack.terms[0].reason.as_str()),
            (7, "schema mismatch")
        );
        assert_eq!(d, delivered(&[4]));
        assert_eq!(settle("progress 7", &mut d), Err(not_ours(7)));
        assert_eq!(settle("term 7", &mut d), Err(not_ours(7)));
        assert_eq!(settle("progress 9", &mut d), Err(not_ours(9)));
    }

    #[test]
    fn unknown_or_settled_seqs_are_refused_and_change_nothing() {
        let mut d = delivered(&[3, 5]);
        assert_eq!(settle("ack 4", &mut d), Err(not_ours(4)));
        assert_eq!(settle("nack 6", &mut d), Err(not_ours(6)));
        assert_eq!(settle("ack-upto 2", &mut d), Err(not_ours(2)));
        assert_eq!(d, delivered(&[3, 5]));
        settle("ack 3", &mut d).unwrap();
        assert_eq!(settle("ack 3", &mut d), Err(not_ours(3)));
        assert_eq!(settle("nack 3", &mut d), Err(not_ours(3)));
        assert_eq!(d, delivered(&[5]));
    }

    #[test]
    fn a_malformed_line_is_refused_and_changes_nothing() {
        let mut d = delivered(&[1]);
        assert!(settle("ack", &mut d).unwrap_err().contains("needs a seq"));
        assert!(settle("hello 1", &mut d)
            .unwrap_err()
            .contains("unknown verb"));
        assert_eq!(d, delivered(&[1]));
    }
}
