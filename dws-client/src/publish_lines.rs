//! `dws event publish EVENT_TYPE --lines`: one event per line of stdin,
//! pipelined over one connection (up to [`WINDOW`] publishes in flight, not
//! one round trip each, and at most [`READ_AHEAD`] bytes of line data read
//! but not answered), one summary object on stdout, each refused line on
//! stderr with its line number.
//!
//! A line is its bytes up to `\n` (a `\r` before it is dropped; a last line
//! without `\n` counts too), taken as `publish EVENT_TYPE DATA` takes DATA.
//! Empty lines are skipped and counted. A refused line (too large, not
//! UTF-8, refused by the bus) is reported and the next lines go on; a lost
//! bus or a failed store stops the run, and what was sent but not answered
//! is reported as unanswered (its outcome is unknown). The exit code is 0
//! only if every non-empty line was accepted.

use std::{
    cell::RefCell,
    collections::HashMap,
    io::{BufRead, Write},
};

use futures_util::{SinkExt, StreamExt};
use proto::limits::MAX_PUBLISH_DATA as MAX_DATA;
use proto::{
    paths::Endpoint,
    v1::{self, client_frame::Kind as C, server_frame::Kind as S, ByeReason},
};
use tokio::sync::{mpsc, Notify, Semaphore};

use crate::{
    bus::BusConn,
    cli::PublishArgs,
    exit::{clip_to, CliError, Result, MESSAGE_CHARS},
    print_stdout,
};

/// Publishes in flight at once. The bus holds up to 65,536 per connection
/// waiting for the disk; a few thousand keep its committer's batches full.
pub const WINDOW: usize = 4096;

/// Lines the stdin thread hands over at once, at most.
const BATCH: usize = 512;

/// The most line data read ahead of the bus's answers: the stdin thread
/// stops reading while lines of this many bytes are read but not answered
/// (one line always goes, so a line can pass it by at most one line).
pub const READ_AHEAD: usize = 64 * 1024 * 1024;

/// Bytes of line data read from stdin and not yet answered by the bus:
/// the stdin thread [`Budget::take`]s each line's (waiting while
/// [`READ_AHEAD`] is used), an answer [`Budget::give`]s it back.
#[derive(Default)]
struct Budget {
    used: std::sync::Mutex<usize>,
    freed: std::sync::Condvar,
}

impl Budget {
    fn take(&self, n: usize) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        while *used > 0 && *used + n > READ_AHEAD {
            used = self.freed.wait(used).unwrap_or_else(|p| p.into_inner());
        }
        *used += n;
    }

    /// Whether `n` more bytes may be taken now without waiting.
    fn fits(&self, n: usize) -> bool {
        let used = *self.used.lock().unwrap_or_else(|p| p.into_inner());
        used == 0 || used + n <= READ_AHEAD
    }

    fn give(&self, n: usize) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        *used = used.saturating_sub(n);
        self.freed.notify_all();
    }
}

/// One line of stdin, as read.
enum Data {
    Text(String),
    Empty,
    TooLarge(usize),
    NotUtf8,
}

struct Line {
    no: u64,
    data: Data,
}

/// What the run did so far; `pending` maps a request id to its line and
/// its data's size.
#[derive(Default)]
struct Tally {
    lines: u64,
    published: u64,
    duplicates: u64,
    refused: u64,
    skipped: u64,
    first_seq: Option<u64>,
    last_seq: Option<u64>,
    first_refusal: Option<(u64, CliError)>,
    pending: HashMap<u64, (u64, usize)>,
    input_done: bool,
    input_error: Option<String>,
}

impl Tally {
    fn refuse(&mut self, no: u64, e: CliError) {
        self.refused += 1;
        let mut err = std::io::stderr().lock();
        let line = format!(
            "line {no} refused: {}",
            e.message.replace(['\n', '\r'], " ")
        );
        let _ = writeln!(err, "[event] {}", clip_to(&line, MESSAGE_CHARS));
        if self.first_refusal.is_none() {
            self.first_refusal = Some((no, e));
        }
    }

    fn accepted(&mut self, ack: &v1::PublishAck) {
        if ack.duplicate {
            self.duplicates += 1;
        } else {
            self.published += 1;
            self.first_seq = Some(self.first_seq.map_or(ack.seq, |s| s.min(ack.seq)));
            self.last_seq = Some(self.last_seq.map_or(ack.seq, |s| s.max(ack.seq)));
        }
    }

    fn summary(&self) -> String {
        let line = serde_json::json!({
            "lines": self.lines,
            "published": self.published,
            "duplicates": self.duplicates,
            "refused": self.refused,
            "skipped": self.skipped,
            "unanswered": self.pending.len(),
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
        });
        format!("{line}\n")
    }

    /// The lines sent but not answered, as `lines A–B` (or one line).
    fn unanswered(&self) -> String {
        let lo = self.pending.values().map(|p| p.0).min().unwrap_or(0);
        let hi = self.pending.values().map(|p| p.0).max().unwrap_or(0);
        let n = self.pending.len();
        let which = if lo == hi {
            format!("line {lo}")
        } else {
            format!("lines {lo}–{hi}")
        };
        format!("{n} publish(es) sent but unanswered ({which}): their outcome is unknown")
    }
}

pub async fn run(args: PublishArgs, endpoint: &Endpoint) -> Result<()> {
    proto::pattern::check_event_type(&args.event_type).map_err(CliError::usage)?;
    if let Some(p) = &args.id_prefix {
        proto::limits::check_printable_id("--id-prefix", p).map_err(CliError::usage)?;
        // The longest id it makes: PREFIX-<the largest line number>.
        proto::limits::check_event_id(&format!("{p}-{}", u64::MAX))
            .map_err(|e| CliError::usage(format!("--id-prefix: {e} for the longest id")))?;
    }
    let mut bus = BusConn::open_or_spawn(endpoint).await?;
    let (tx, mut rx) = mpsc::channel(8);
    let budget = std::sync::Arc::new(Budget::default());
    let reader_budget = budget.clone();
    std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || read_lines(&tx, &reader_budget))
        .map_err(|e| CliError::runtime(format!("cannot start the stdin reader: {e}")))?;

    let tally = RefCell::new(Tally::default());
    let window = Semaphore::new(WINDOW);
    let done = Notify::new();
    let BusConn { reader, writer, .. } = &mut bus;
    let gone =
        |e: proto::CodecError| CliError::bus_gone(format!("lost the connection to the bus: {e}"));

    let send = async {
        let mut next_id = 0u64;
        while let Some(batch) = rx.recv().await {
            let batch = match batch {
                Ok(b) => b,
                Err(e) => {
                    tally.borrow_mut().input_error = Some(e);
                    break;
                }
            };
            for line in batch {
                tally.borrow_mut().lines += 1;
                let data = match line.data {
                    Data::Text(s) => s,
                    Data::Empty => {
                        tally.borrow_mut().skipped += 1;
                        continue;
                    }
                    Data::TooLarge(n) => {
                        let m = format!(
                            "event data is {n} bytes; the most a frame carries is {MAX_DATA}"
                        );
                        tally.borrow_mut().refuse(line.no, CliError::usage(m));
                        continue;
                    }
                    Data::NotUtf8 => {
                        let m = "event data is not valid UTF-8";
                        tally.borrow_mut().refuse(line.no, CliError::usage(m));
                        continue;
                    }
                };
                // A full window: what is buffered must reach the bus before
                // its answers can free a place.
                let permit = match window.try_acquire() {
                    Ok(p) => p,
                    Err(_) => {
                        SinkExt::<v1::ClientFrame>::flush(writer)
                            .await
                            .map_err(gone)?;
                        window.acquire().await.expect("the window is never closed")
                    }
                };
                permit.forget();
                next_id += 1;
                tally
                    .borrow_mut()
                    .pending
                    .insert(next_id, (line.no, data.len()));
                let event_id = match &args.id_prefix {
                    Some(p) => format!("{p}-{}", line.no),
                    None => String::new(),
                };
                let publish = C::Publish(v1::Publish {
                    request_id: next_id,
                    event_type: args.event_type.clone(),
                    event_id,
                    data,
                    headers: Default::default(),
                });
                writer
                    .feed(v1::ClientFrame {
                        kind: Some(publish),
                    })
                    .await
                    .map_err(gone)?;
            }
            SinkExt::<v1::ClientFrame>::flush(writer)
                .await
                .map_err(gone)?;
        }
        SinkExt::<v1::ClientFrame>::flush(writer)
            .await
            .map_err(gone)?;
        tally.borrow_mut().input_done = true;
        done.notify_one();
        Ok::<(), CliError>(())
    };

    let receive = async {
        loop {
            {
                let t = tally.borrow();
                if t.input_done && t.pending.is_empty() {
                    return Ok::<(), CliError>(());
                }
            }
            let frame = tokio::select! {
                f = reader.next() => f,
                () = done.notified() => continue,
            };
            let kind = match frame {
                None => return Err(CliError::bus_gone("the bus closed the connection")),
                Some(Err(e @ (proto::CodecError::Io(_) | proto::CodecError::Truncated))) => {
                    return Err(gone(e))
                }
                Some(Err(e)) => {
                    return Err(CliError::runtime(format!("bad frame from the bus: {e}")))
                }
                Some(Ok(v1::ServerFrame { kind: None })) => continue,
                Some(Ok(v1::ServerFrame { kind: Some(k) })) => k,
            };
            match kind {
                S::PublishAck(ack) => {
                    let mut t = tally.borrow_mut();
                    let Some((_, bytes)) = t.pending.remove(&ack.request_id) else {
                        return Err(CliError::runtime(format!(
                            "the bus answered request {} that was not asked",
                            ack.request_id
                        )));
                    };
                    budget.give(bytes);
                    t.accepted(&ack);
                    window.add_permits(1);
                }
                S::Error(e) if e.request_id != 0 => {
                    let mut t = tally.borrow_mut();
                    let Some((no, bytes)) = t.pending.remove(&e.request_id) else {
                        return Err(CliError::from_bus(e.code, &e.message));
                    };
                    budget.give(bytes);
                    t.refuse(no, CliError::from_bus(e.code, &e.message));
                    window.add_permits(1);
                }
                S::Error(e) => return Err(CliError::from_bus(e.code, &e.message)),
                S::Bye(b) => {
                    let reason = ByeReason::try_from(b.reason).unwrap_or(ByeReason::Unspecified);
                    return Err(CliError::bus_gone(format!(
                        "the bus closed the connection (reason: {})",
                        proto::bye_reason_name(reason)
                    )));
                }
                _ => continue,
            }
        }
    };

    let outcome = tokio::try_join!(send, receive);
    let t = tally.into_inner();
    print_stdout(&t.summary())?;
    if let Err(mut e) = outcome {
        if !t.pending.is_empty() {
            e.message = format!("{}; {}", e.message, t.unanswered());
        }
        return Err(e);
    }
    bus.bye().await;
    if let Some(e) = t.input_error {
        return Err(CliError::runtime(format!(
            "cannot read stdin after line {}: {e}",
            t.lines
        )));
    }
    if let Some((no, e)) = t.first_refusal {
        return Err(CliError {
            message: format!(
                "{} of {} line(s) refused (the first, line {no}: {})",
                t.refused, t.lines, e.message
            ),
            ..e
        });
    }
    Ok(())
}

/// The stdin thread: lines in batches, handed over whenever stdin has
/// nothing more buffered (so a slow writer's lines go out at once) or a
/// batch is full; a read error ends the input.
fn read_lines(tx: &mpsc::Sender<std::result::Result<Vec<Line>, String>>, budget: &Budget) {
    let mut input = std::io::BufReader::with_capacity(256 * 1024, std::io::stdin());
    let mut batch = Vec::with_capacity(BATCH);
    let mut no = 0u64;
    loop {
        match read_capped(&mut input, MAX_DATA) {
            Ok(Some((bytes, len))) => {
                no += 1;
                let data = classify(bytes, len, MAX_DATA);
                if let Data::Text(t) = &data {
                    // Hand over what is read before waiting for room.
                    if !batch.is_empty() && !budget.fits(t.len()) {
                        let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                        if tx.blocking_send(Ok(full)).is_err() {
                            return;
                        }
                    }
                    budget.take(t.len());
                }
                batch.push(Line { no, data });
                if batch.len() >= BATCH || input.buffer().is_empty() {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                    if tx.blocking_send(Ok(full)).is_err() {
                        return;
                    }
                }
            }
            Ok(None) => break,
            Err(e) => {
                if !batch.is_empty() {
                    let _ = tx.blocking_send(Ok(std::mem::take(&mut batch)));
                }
                let _ = tx.blocking_send(Err(e.to_string()));
                return;
            }
        }
    }
    if !batch.is_empty() {
        let _ = tx.blocking_send(Ok(batch));
    }
}

fn classify(bytes: Vec<u8>, len: usize, limit: usize) -> Data {
    if len == 0 {
        Data::Empty
    } else if len > limit {
        Data::TooLarge(len)
    } else {
        String::from_utf8(bytes).map_or(Data::NotUtf8, Data::Text)
    }
}

/// The next line without its `\n` (and a `\r` before it), keeping at most
/// `limit + 1` of its bytes, and its whole length; `None` at the end of
/// the input. A line longer than the limit is read to its end and dropped,
/// never held.
fn read_capped(r: &mut impl BufRead, limit: usize) -> std::io::Result<Option<(Vec<u8>, usize)>> {
    let mut kept = Vec::new();
    let mut len = 0usize;
    let mut any = false;
    loop {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(any.then(|| strip_cr(kept, len)));
        }
        any = true;
        let end = buf.iter().position(|&b| b == b'\n');
        let chunk = &buf[..end.unwrap_or(buf.len())];
        len += chunk.len();
        if kept.len() <= limit {
            let room = limit + 1 - kept.len();
            kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
        }
        let used = end.map_or(buf.len(), |i| i + 1);
        r.consume(used);
        if end.is_some() {
            return Ok(Some(strip_cr(kept, len)));
        }
    }
}

fn strip_cr(mut kept: Vec<u8>, mut len: usize) -> (Vec<u8>, usize) {
    if kept.len() == len && kept.last() == Some(&b'\r') {
        kept.pop();
        len -= 1;
    }
    (kept, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], limit: usize) -> Vec<(Vec<u8>, usize)> {
        let mut r = std::io::BufReader::with_capacity(4, input);
        std::iter::from_fn(|| read_capped(&mut r, limit).expect("read")).collect()
    }

    #[test]
    fn lines_end_at_newlines_a_cr_before_one_is_dropped_and_the_last_needs_none() {
        let got = lines(b"a\r\n\nbc\nlast", 100);
        let want: Vec<(Vec<u8>, usize)> = vec![
            (b"a".to_vec(), 1),
            (Vec::new(), 0),
            (b"bc".to_vec(), 2),
            (b"last".to_vec(), 4),
        ];
        assert_eq!(got, want);
        assert!(lines(b"", 100).is_empty());
        assert_eq!(lines(b"\n", 100), vec![(Vec::new(), 0)]);
    }

    #[test]
    fn a_line_over_the_limit_is_measured_not_kept() {
        let got = lines(b"0123456789\nok\n", 4);
        assert_eq!(got[0].0.len(), 5, "at most limit + 1 bytes kept");
        assert_eq!(got[0].1, 10);
        assert_eq!(got[1], (b"ok".to_vec(), 2));
        assert!(matches!(
            classify(got[0].0.clone(), got[0].1, 4),
            Data::TooLarge(10)
        ));
        assert!(matches!(classify(vec![0xff], 1, 4), Data::NotUtf8));
        assert!(matches!(classify(Vec::new(), 0, 4), Data::Empty));
    }
}
