//! Redis clients (the `redis` crate's synchronous API over the Unix socket):
//! pub/sub publisher and subscriber, and the Streams publisher and
//! consumer-group subscriber, with the semantics of the reference clients.

use crate::procs::now_ns;
use crate::role::{print_ready, pub_json, wait_go, write_samples, Pacer, RoleArgs, RoleKind};
use crate::stats::{new_payload, stamp, SubStats};
use crate::PeersError;
use redis::{Connection, Value};
use serde_json::json;
use std::time::Duration;

impl From<redis::RedisError> for PeersError {
    fn from(e: redis::RedisError) -> PeersError {
        PeersError::Client(format!("redis: {e}"))
    }
}

pub fn connect(url: &str, timeout: Duration) -> Result<Connection, PeersError> {
    let con = redis::Client::open(url)?.get_connection()?;
    con.set_read_timeout(Some(timeout))?;
    con.set_write_timeout(Some(timeout))?;
    Ok(con)
}

pub fn run(a: &RoleArgs) -> Result<serde_json::Value, PeersError> {
    match a.kind {
        RoleKind::RedisPub => pipelined(a, "PUBLISH"),
        RoleKind::XaddPub => pipelined(a, "XADD"),
        RoleKind::RedisLatpub | RoleKind::XaddLatpub => latpub(a),
        RoleKind::RedisSub | RoleKind::RedisLatsub => subscribe(a),
        RoleKind::XreadSub => group_reader(a),
        _ => Err(PeersError::Run(format!("{:?} is not a Redis role", a.kind))),
    }
}

fn command(kind: RoleKind, topic: &str, payload: &[u8]) -> redis::Cmd {
    let mut c = if matches!(kind, RoleKind::XaddPub | RoleKind::XaddLatpub) {
        let mut c = redis::cmd("XADD");
        c.arg(topic).arg("*").arg("d");
        c
    } else {
        let mut c = redis::cmd("PUBLISH");
        c.arg(topic);
        c
    };
    c.arg(payload);
    c
}

/// PUBLISH or XADD, --batch commands appended, then their replies read; for
/// XADD one latency sample per batch (first append → last reply).
fn pipelined(a: &RoleArgs, what: &str) -> Result<serde_json::Value, PeersError> {
    let mut con = connect(&a.url, Duration::from_secs(120))?;
    wait_go(a)?;
    let mut buf = new_payload(a.size);
    let (mut sent, mut receivers, mut batches) = (0u64, 0i64, 0u64);
    let mut lat = Vec::new();
    let start = now_ns();
    while sent < a.msgs {
        let n = (a.msgs - sent).min(a.batch.max(1) as u64);
        let t0 = now_ns();
        let mut p = redis::pipe();
        for k in 0..n {
            stamp(&mut buf, sent + k, t0);
            p.add_command(command(a.kind, &a.topic, &buf));
        }
        let replies: Vec<Value> = p.query(&mut con)?;
        if replies.len() as u64 != n {
            return Err(PeersError::Client(format!(
                "{what}: {} replies for {n} commands",
                replies.len()
            )));
        }
        receivers += replies
            .iter()
            .map(|r| if let Value::Int(i) = r { *i } else { 0 })
            .sum::<i64>();
        lat.push(now_ns().saturating_sub(t0) as i64);
        sent += n;
        batches += 1;
    }
    let end = now_ns();
    write_samples(a.latfile.as_deref(), &lat)?;
    Ok(pub_json(
        sent,
        start,
        end,
        json!({"receivers_sum": receivers, "batches": batches, "lat_unit": "batch"}),
    ))
}

/// One command per tick at --rate for --duration, waiting for each reply.
fn latpub(a: &RoleArgs) -> Result<serde_json::Value, PeersError> {
    let mut con = connect(&a.url, Duration::from_secs(120))?;
    wait_go(a)?;
    let mut buf = new_payload(a.size);
    let total = a.lat_msgs();
    let mut lat = Vec::with_capacity(total as usize);
    let mut pace = Pacer::new(total, a.rate);
    while let Some(t) = pace.tick(&mut buf) {
        let _: Value = command(a.kind, &a.topic, &buf).query(&mut con)?;
        lat.push(now_ns().saturating_sub(t) as i64);
    }
    let end = now_ns();
    write_samples(a.latfile.as_deref(), &lat)?;
    Ok(pub_json(total, pace.start_ns(), end, pace.lag.json()))
}

/// SUBSCRIBE, READY on its confirmation, then count messages until --msgs (or
/// rate×duration for a latency subscriber) or --idle-ms without one. The
/// pushes are read by [`crate::resp`], not by the crate's PubSub.
fn subscribe(a: &RoleArgs) -> Result<serde_json::Value, PeersError> {
    use std::io::Write;
    let latency = a.kind == RoleKind::RedisLatsub;
    let path = a
        .url
        .strip_prefix("redis+unix://")
        .ok_or_else(|| PeersError::Run(format!("not a unix socket URL: {}", a.url)))?;
    let mut sock = std::os::unix::net::UnixStream::connect(path)
        .map_err(|e| PeersError::io("connect to redis", e))?;
    sock.set_read_timeout(Some(Duration::from_millis(a.idle_ms.max(1))))
        .map_err(|e| PeersError::io("set a timeout", e))?;
    sock.write_all(&redis::cmd("SUBSCRIBE").arg(&a.topic).get_packed_command())
        .map_err(|e| PeersError::io("subscribe", e))?;
    let expect = if latency { a.lat_msgs() } else { a.msgs };
    let mut st = SubStats::new(latency);
    let read = crate::resp::read_pushes(&mut sock, |kind, payload| {
        if kind == b"subscribe" {
            print_ready();
        } else if kind == b"message" {
            st.add(payload, now_ns());
        }
        st.recv < expect
    });
    match read {
        Ok(()) => {}
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) => {}
        Err(e) => return Err(PeersError::io("read pushes", e)),
    }
    write_samples(a.latfile.as_deref(), st.samples.as_deref().unwrap_or(&[]))?;
    Ok(st.to_json(json!({})))
}

/// One consumer group: XREADGROUP COUNT --fetch BLOCK --idle-ms, one XACK of
/// each batch pipelined with the next read; the last XACK awaited; then
/// XPENDING says what is left unacked.
fn group_reader(a: &RoleArgs) -> Result<serde_json::Value, PeersError> {
    let mut con = connect(&a.url, Duration::from_millis(a.idle_ms + 30_000))?;
    let created: Result<Value, _> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&a.topic)
        .arg(&a.name)
        .arg("0")
        .arg("MKSTREAM")
        .query(&mut con);
    if let Err(e) = created {
        if e.code() != Some("BUSYGROUP") {
            return Err(e.into());
        }
    }
    print_ready();
    let mut st = SubStats::new(false);
    let (mut acked, mut reads) = (0i64, 0u64);
    let mut ids: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut p = redis::pipe();
        if !ids.is_empty() {
            p.cmd("XACK").arg(&a.topic).arg(&a.name).arg(&ids);
        }
        p.cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&a.name)
            .arg("c")
            .arg("COUNT")
            .arg(a.fetch);
        p.arg("BLOCK")
            .arg(a.idle_ms)
            .arg("STREAMS")
            .arg(&a.topic)
            .arg(">");
        let replies: Vec<Value> = p.query(&mut con)?;
        if !ids.is_empty() {
            acked += int(replies.first());
        }
        let Some(read) = replies.last() else { break };
        let Some(entries) = entries_of(read) else {
            break;
        };
        ids = Vec::with_capacity(entries.len());
        for (id, payload) in entries {
            st.add(payload, now_ns());
            ids.push(id.to_vec());
        }
        reads += 1;
        if st.recv >= a.msgs {
            let n: i64 = redis::cmd("XACK")
                .arg(&a.topic)
                .arg(&a.name)
                .arg(&ids)
                .query(&mut con)?;
            acked += n;
            break;
        }
    }
    let pending: Value = redis::cmd("XPENDING")
        .arg(&a.topic)
        .arg(&a.name)
        .query(&mut con)?;
    let pending = match &pending {
        Value::Array(v) => match v.first() {
            Some(Value::Int(n)) => *n,
            _ => -1,
        },
        _ => -1,
    };
    Ok(st.to_json(json!({"acked": acked, "reads": reads, "pending_after": pending})))
}

fn int(v: Option<&Value>) -> i64 {
    match v {
        Some(Value::Int(i)) => *i,
        _ => 0,
    }
}

/// The (id, payload of field `d`) pairs of an XREADGROUP reply; None for nil
/// (BLOCK timed out).
pub fn entries_of(v: &Value) -> Option<Vec<(&[u8], &[u8])>> {
    let Value::Array(streams) = v else {
        return None;
    };
    let Some(Value::Array(kv)) = streams.first() else {
        return None;
    };
    let Some(Value::Array(entries)) = kv.get(1) else {
        return Some(Vec::new());
    };
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        let Value::Array(e) = e else { continue };
        let (Some(Value::BulkString(id)), Some(Value::Array(fields))) = (e.first(), e.get(1))
        else {
            continue;
        };
        if let Some(Value::BulkString(p)) = fields.get(1) {
            out.push((id.as_slice(), p.as_slice()));
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xreadgroup_reply_yields_ids_and_payloads() {
        let b = |s: &[u8]| Value::BulkString(s.to_vec());
        let entry =
            |id: &[u8], p: &[u8]| Value::Array(vec![b(id), Value::Array(vec![b(b"d"), b(p)])]);
        let reply = Value::Array(vec![Value::Array(vec![
            b(b"bench"),
            Value::Array(vec![entry(b"1-0", b"x"), entry(b"1-1", b"yy")]),
        ])]);
        let got = entries_of(&reply).expect("entries");
        assert_eq!(
            got,
            vec![(&b"1-0"[..], &b"x"[..]), (&b"1-1"[..], &b"yy"[..])]
        );
        assert!(entries_of(&Value::Nil).is_none());
    }
}
