//! NATS clients (`async-nats` on a current-thread tokio runtime): the core
//! publisher and subscriber, and for JetStream the stream set-up and check,
//! the windowed async publisher, the one-at-a-time publisher and the durable
//! pull consumer, with the semantics of the reference clients.

use crate::procs::now_ns;
use crate::role::{print_ready, pub_json, wait_go, write_samples, Pacer, RoleArgs, RoleKind};
use crate::stats::{new_payload, stamp, SubStats};
use crate::PeersError;
use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use serde_json::{json, Value};
use std::future::Future;
use std::time::Duration;

pub const STREAM: &str = "BENCH";
pub const FILTER: &str = "bench.>";
/// The subject JetStream publishers send to.
pub const JS_SUBJECT: &str = "bench.x";

fn err(what: &str) -> impl Fn(&dyn std::fmt::Display) -> PeersError + '_ {
    move |e| PeersError::Client(format!("nats {what}: {e}"))
}

/// Runs `f` on a fresh current-thread runtime.
pub fn block_on<T>(f: impl Future<Output = Result<T, PeersError>>) -> Result<T, PeersError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| PeersError::io("start a tokio runtime", e))?
        .block_on(f)
}

/// Connects on a thread of its own: the connection's reader/writer task runs
/// there, the caller's loop on the calling thread (as the C client's flusher
/// and reader threads). Tokio's channels and timers work across the two.
pub async fn connect(url: &str) -> Result<async_nats::Client, PeersError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let url = url.to_string();
    std::thread::spawn(move || {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                let _ = tx.send(Err(PeersError::io("start a tokio runtime", e)));
                return;
            }
        };
        rt.block_on(async move {
            let c = async_nats::connect(url)
                .await
                .map_err(|e| err("connect")(&e));
            let up = c.is_ok();
            let _ = tx.send(c);
            if up {
                // Keep serving the connection until the process exits.
                std::future::pending::<()>().await;
            }
        });
    });
    rx.await
        .map_err(|_| PeersError::Client("nats connect: the connection thread ended".into()))?
}

pub fn run(a: &RoleArgs) -> Result<Value, PeersError> {
    block_on(async {
        match a.kind {
            RoleKind::NatsPub => core_pub(a).await,
            RoleKind::NatsSub => core_sub(a).await,
            RoleKind::JsPub => js_pub(a).await,
            RoleKind::JsLatpub => js_latpub(a).await,
            RoleKind::JsSub => js_sub(a).await,
            _ => Err(PeersError::Run(format!("{:?} is not a NATS role", a.kind))),
        }
    })
}

/// Publish in a loop (the client buffers and writes), then flush.
async fn core_pub(a: &RoleArgs) -> Result<Value, PeersError> {
    let c = connect(&a.url).await?;
    let mut buf = new_payload(a.size);
    // Built once: each publish clones it (a reference count, no copy).
    let subject = async_nats::Subject::from(a.topic.clone());
    let start = now_ns();
    for i in 0..a.msgs {
        stamp(&mut buf, i, now_ns());
        c.publish(subject.clone(), Bytes::copy_from_slice(&buf))
            .await
            .map_err(|e| err("publish")(&e))?;
    }
    c.flush().await.map_err(|e| err("flush")(&e))?;
    Ok(pub_json(a.msgs, start, now_ns(), json!({})))
}

/// Subscribe, flush, READY, count until --msgs or --idle-ms without one.
async fn core_sub(a: &RoleArgs) -> Result<Value, PeersError> {
    let c = connect(&a.url).await?;
    let mut sub = c
        .subscribe(a.topic.clone())
        .await
        .map_err(|e| err("subscribe")(&e))?;
    c.flush().await.map_err(|e| err("flush")(&e))?;
    print_ready();
    let mut st = SubStats::new(false);
    let idle = Duration::from_millis(a.idle_ms.max(1));
    while st.recv < a.msgs {
        // A message already queued is taken without arming a timer (one
        // timer per message cost more than the rest of the loop).
        let next = match sub.next().now_or_never() {
            Some(m) => m,
            None => tokio::time::timeout(idle, sub.next()).await.ok().flatten(),
        };
        let Some(m) = next else { break };
        st.add(&m.payload, now_ns());
    }
    Ok(st.to_json(json!({})))
}

/// Deletes stream BENCH if present and creates it: file storage, 1 replica,
/// limits retention (JetStream may still be starting: retried for 10 s).
pub fn js_setup(url: &str) -> Result<Value, PeersError> {
    block_on(async {
        let js = jetstream::new(connect(url).await?);
        let _ = js.delete_stream(STREAM).await;
        let cfg = stream::Config {
            name: STREAM.into(),
            subjects: vec![FILTER.into()],
            storage: stream::StorageType::File,
            retention: stream::RetentionPolicy::Limits,
            num_replicas: 1,
            ..Default::default()
        };
        let mut last = String::new();
        for _ in 0..50 {
            match js.create_stream(cfg.clone()).await {
                Ok(_) => return Ok(json!({"stream": STREAM, "storage": "file", "replicas": 1})),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(PeersError::Client(format!("nats add stream: {last}")))
    })
}

/// Stream BENCH's message count and bytes.
pub fn js_check(url: &str) -> Result<Value, PeersError> {
    block_on(async {
        let js = jetstream::new(connect(url).await?);
        let mut s = js
            .get_stream(STREAM)
            .await
            .map_err(|e| err("stream info")(&e))?;
        let i = s.info().await.map_err(|e| err("stream info")(&e))?;
        Ok(
            json!({"msgs": i.state.messages, "bytes": i.state.bytes, "last_seq": i.state.last_sequence}),
        )
    })
}

/// Async publishes with at most --window PubAcks outstanding; a task awaits
/// them in order and records, per message, publish call → PubAck.
async fn js_pub(a: &RoleArgs) -> Result<Value, PeersError> {
    let js = jetstream::new(connect(&a.url).await?);
    wait_go(a)?;
    let (tx, mut rx) =
        tokio::sync::mpsc::channel::<jetstream::context::PublishAckFuture>(a.window.max(1));
    let acks = tokio::spawn(async move {
        let (mut ok, mut errors, mut last_seq, mut lat) = (0u64, 0u64, 0u64, Vec::new());
        while let Some(f) = rx.recv().await {
            match f.await {
                Ok(ack) => {
                    ok += 1;
                    last_seq = last_seq.max(ack.sequence);
                }
                Err(e) => {
                    errors += 1;
                    if errors <= 5 {
                        warn!("dws-peers: puback error: {e}");
                    }
                }
            }
            lat.push(now_ns());
        }
        (ok, errors, last_seq, lat)
    });
    let mut buf = new_payload(a.size);
    let mut sent_at = Vec::with_capacity(a.msgs as usize);
    let subject = async_nats::Subject::from(a.topic.clone());
    let start = now_ns();
    for i in 0..a.msgs {
        let t = now_ns();
        stamp(&mut buf, i, t);
        sent_at.push(t);
        let f = js
            .publish(subject.clone(), Bytes::copy_from_slice(&buf))
            .await
            .map_err(|e| err("publish")(&e))?;
        if tx.send(f).await.is_err() {
            return Err(PeersError::Client("nats: the PubAck task ended".into()));
        }
    }
    drop(tx);
    let (ok, errors, last_seq, acked_at) = acks.await.map_err(|e| err("PubAck task")(&e))?;
    let end = now_ns();
    let lat: Vec<i64> = sent_at
        .iter()
        .zip(&acked_at)
        .map(|(s, a)| a.saturating_sub(*s) as i64)
        .collect();
    write_samples(a.latfile.as_deref(), &lat)?;
    let extra = json!({"acked": ok, "ack_errors": errors, "last_seq": last_seq, "window": a.window, "lat_unit": "message"});
    Ok(pub_json(a.msgs, start, end, extra))
}

/// One publish at a time at --rate, each awaited to its PubAck.
async fn js_latpub(a: &RoleArgs) -> Result<Value, PeersError> {
    let js = jetstream::new(connect(&a.url).await?);
    wait_go(a)?;
    let mut buf = new_payload(a.size);
    let subject = async_nats::Subject::from(a.topic.clone());
    let (mut lat, mut sent, mut errors) = (Vec::new(), 0u64, 0u64);
    let mut pace = Pacer::new(a.lat_msgs(), a.rate);
    while let Some(t) = pace.tick(&mut buf) {
        let r = match js
            .publish(subject.clone(), Bytes::copy_from_slice(&buf))
            .await
        {
            Ok(f) => f.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match r {
            Ok(()) => {
                lat.push(now_ns().saturating_sub(t) as i64);
                sent += 1;
            }
            Err(e) => {
                errors += 1;
                if errors <= 5 {
                    warn!("dws-peers: publish: {e}");
                }
            }
        }
    }
    let end = now_ns();
    write_samples(a.latfile.as_deref(), &lat)?;
    let mut extra = pace.lag.json();
    extra["errors"] = json!(errors);
    Ok(pub_json(sent, pace.start_ns(), end, extra))
}

/// A durable pull consumer (DeliverAll, AckAll): fetch up to --fetch (never
/// more than still expected), ack each batch's last message (the run's last
/// one awaited: double ack), then report NumAckPending + NumPending.
async fn js_sub(a: &RoleArgs) -> Result<Value, PeersError> {
    let js = jetstream::new(connect(&a.url).await?);
    let s = js
        .get_stream(STREAM)
        .await
        .map_err(|e| err("get stream")(&e))?;
    let cfg = consumer::pull::Config {
        durable_name: Some(a.name.clone()),
        deliver_policy: consumer::DeliverPolicy::All,
        ack_policy: consumer::AckPolicy::All,
        ..Default::default()
    };
    let mut c = s
        .create_consumer(cfg)
        .await
        .map_err(|e| err("create consumer")(&e))?;
    print_ready();
    let mut st = SubStats::new(false);
    let (mut fetches, mut acks_sent) = (0u64, 0u64);
    let idle = Duration::from_millis(a.idle_ms.max(1));
    while st.recv < a.msgs {
        let want = (a.msgs - st.recv).min(a.fetch.max(1) as u64) as usize;
        let mut batch = c
            .batch()
            .max_messages(want)
            .expires(idle)
            .messages()
            .await
            .map_err(|e| err("fetch")(&e))?;
        let mut last = None;
        while let Some(m) = batch.next().await {
            let m = m.map_err(|e| err("fetch")(&e))?;
            st.add(&m.payload, now_ns());
            last = Some(m);
        }
        let Some(m) = last else { break };
        fetches += 1;
        if st.recv >= a.msgs {
            m.double_ack().await.map_err(|e| err("ack sync")(&e))?;
        } else {
            m.ack().await.map_err(|e| err("ack")(&e))?;
        }
        acks_sent += 1;
    }
    let pending = match c.info().await {
        Ok(i) => i.num_ack_pending as i64 + i.num_pending as i64,
        Err(_) => -1,
    };
    let extra = json!({"fetches": fetches, "acks_sent": acks_sent, "ack_policy": "all", "pending_after": pending});
    Ok(st.to_json(extra))
}
