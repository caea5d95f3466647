//! Frame dispatch: what the connection does with each decoded `ClientFrame`
//! — Hello first (and the version check), then subscribe (binding an
//! upstream subscription first where the source has a control plane),
//! unsubscribe, acks, subscription control, reading one event by seq,
//! publish, stop, status,
//! heartbeat and the client's Bye — and with a frame that could not be
//! decoded ([`Connection::bad_frame`]). Replies that must wait for the store
//! go through [`Connection::reply_after`].

use std::time::Duration;

use bytes::BytesMut;
use proto::{
    limits::MAX_EVENT_ID_LEN,
    v1::{self, client_frame::Kind as C, server_frame::Kind as S, ErrorCode},
    CodecError, ServerCodec,
};
use tokio_util::codec::Decoder;

use super::{
    consumer::{Consumer, Form},
    replies::Until,
    Connection, Phase,
};
use crate::{
    hub::{NewEvent, RefusedKind},
    pattern::Pattern,
    warn_limited,
};

impl Connection {
    fn ack(&mut self, ack: &v1::Ack) {
        if let Some(c) = self.consumer.as_mut() {
            if ack.ring_read > 0 {
                c.ring_read(ack.ring_read);
            }
            if ack.ring_off {
                // Before its nacks: what they give back comes as bytes.
                c.ring_off();
            }
        }
        self.session.ack(ack)
    }

    /// The client went away while the bus wrote to it: of the whole frames
    /// it had sent (`input`), its acks still count — it wrote those events —
    /// and nothing else is done, since no reply could reach it. `false`
    /// once a frame cannot be decoded (nothing after it counts).
    pub(super) fn acks_left(&mut self, codec: &mut ServerCodec, input: &mut BytesMut) -> bool {
        loop {
            match codec.decode(input) {
                Ok(Some(v1::ClientFrame {
                    kind: Some(C::Ack(ack)),
                })) => self.ack(&ack),
                Ok(Some(_)) => {}
                Ok(None) => return true,
                Err(_) => return false,
            }
        }
    }

    /// Answers a frame that could not be decoded with an `Error` (where the
    /// socket still allows it) and closes the connection.
    pub(super) fn bad_frame(&mut self, e: &CodecError) {
        warn_limited!(self.warnings, conn = self.id, cause = %e, "bad frame; closing connection");
        self.session.count_refused(RefusedKind::BadFrame);
        match e {
            CodecError::TooLarge => self.error(0, ErrorCode::FrameTooLarge, e.to_string()),
            CodecError::Decode(_) | CodecError::Truncated => {
                self.error(0, ErrorCode::BadRequest, e.to_string())
            }
            CodecError::Io(_) => {}
        }
        self.closing = true;
    }

    pub(super) async fn handle(&mut self, frame: v1::ClientFrame) {
        let Some(kind) = frame.kind else {
            self.error(0, ErrorCode::BadRequest, "empty frame: no message set");
            self.closing = true;
            return;
        };
        if let Phase::AwaitHello = self.phase {
            let C::Hello(hello) = kind else {
                self.error(0, ErrorCode::BadRequest, "the first frame must be Hello");
                self.closing = true;
                return;
            };
            return self.hello(hello);
        }
        if counts_as_activity(&kind) {
            self.session.mark_active();
        }
        match kind {
            C::Hello(_) => self.error(0, ErrorCode::BadRequest, "Hello sent twice"),
            C::Subscribe(req) => self.subscribe(req).await,
            C::Unsubscribe(req) => {
                let (removed, not_found, save) = self.session.unsubscribe(&req.subscription_ids);
                let reply = S::Unsubscribed(v1::Unsubscribed {
                    request_id: req.request_id,
                    removed,
                    not_found,
                });
                self.reply_after(req.request_id, save.map(Until::SubsGen), reply);
            }
            C::Ack(ack) => self.ack(&ack),
            C::RingRequest(req) => self.ring_offer(req.request_id),
            C::SubscriptionControl(req) => match self.session.control(&req) {
                Ok((doc, save)) => {
                    let reply = S::SubscriptionState(v1::SubscriptionState {
                        request_id: req.request_id,
                        json: doc.to_string(),
                    });
                    self.reply_after(req.request_id, save.map(Until::SubsGen), reply);
                }
                Err(r) => self.error(req.request_id, r.code, r.message),
            },
            C::Bye(_) => {
                self.session.detach();
                self.closing = true;
            }
            C::StatusRequest(req) => {
                let json = self.status_that_fits();
                self.send(S::StatusReply(v1::StatusReply {
                    request_id: req.request_id,
                    json,
                }));
            }
            C::GetEvent(req) => match self.session.get_event(req.seq) {
                Some(event) => self.send(S::EventReply(v1::EventReply {
                    request_id: req.request_id,
                    event: Some(event),
                })),
                None => {
                    // A seq past the head was never given: say so, not
                    // "not retained".
                    let head = self.session.head_seq();
                    let why = if req.seq > head {
                        format!(
                            "seq {} is beyond the head, {head} (no event has it yet)",
                            req.seq
                        )
                    } else {
                        format!("seq {} is not retained", req.seq)
                    };
                    self.error(req.request_id, ErrorCode::NotFound, why)
                }
            },
            C::StopRequest(req) => self.stop(req),
            C::Publish(req) => self.publish(req),
            C::Heartbeat(_) => self.send(S::Heartbeat(v1::Heartbeat {
                unix_ms: crate::clock::now_ms(),
            })),
        }
    }

    /// Subscribe: on a cluster host, claims the definition of a named
    /// subscription first (and gives it back if it was new and the request
    /// is refused after all), then [`Self::subscribe_here`].
    async fn subscribe(&mut self, req: v1::Subscribe) {
        // A named subscription has one definition cluster-wide: claimed
        // before anything is bound upstream or created here.
        let mut claimed = None;
        if let Some(link) = self.link.clone() {
            match link.claim_definition(&req).await {
                Ok(true) => claimed = Some(link),
                Ok(false) => {}
                Err(r) => return self.error(req.request_id, r.code, r.message),
            }
        }
        if !self.subscribe_here(&req).await {
            if let Some(link) = claimed {
                link.release_definition(req.subscription_id.clone());
            }
        }
    }

    /// Subscribe, binding an upstream subscription first when the source has
    /// a control plane. That call may take a while (it is HTTP); it stalls
    /// only this connection, and its refusal is this request's `Error`.
    /// Whether the request was answered with `Subscribed`.
    async fn subscribe_here(&mut self, req: &v1::Subscribe) -> bool {
        let mut upstream_id = None;
        match (self.session.upstream_for(req), &req.upstream) {
            (Some(ctl), Some(spec)) => {
                // Only an explicit TTL bounds the upstream subscription: the
                // bus's default TTL is about detached *local* subscriptions,
                // and an attached consumer must not lose its upstream at it.
                // Without one, the last local release cancels it.
                // `never` asks the upstream for no expiry; a TTL is at most 100 years.
                let ttl = proto::limits::ttl_from_ms(req.ttl_ms)
                    .filter(|&d| d != Duration::MAX)
                    .map_or(Duration::ZERO, |d| d.min(proto::limits::MAX_DURATION));
                match ctl.acquire(&req.patterns, spec, ttl).await {
                    Ok(id) => upstream_id = Some(id),
                    Err(r) => {
                        self.error(req.request_id, r.code, r.message);
                        return false;
                    }
                }
            }
            (Some(_), None) => {
                self.error(
                    req.request_id,
                    ErrorCode::BadRequest,
                    format!(
                        "the {} source needs an upstream rule for a new subscription (--rule and its target)",
                        self.session.config().source_kind
                    ),
                );
                return false;
            }
            (None, Some(_)) if !self.session.has_upstream_control() => {
                self.error(
                    req.request_id,
                    ErrorCode::BadRequest,
                    format!(
                        "the {} source has no upstream subscriptions: --rule, --user, --open-dingtalk-id, \
                         --group, --query and --filter-json apply to the personal source",
                        self.session.config().source_kind
                    ),
                );
                return false;
            }
            (None, _) => {}
        }
        match self.session.subscribe(req, upstream_id) {
            // A named subscription is on disk before anyone is told it exists.
            Ok((reply, save)) => {
                // Attached: a consumer from now on, in the form it asked
                // (attaching again on this connection changes only that).
                if let Some(form) = Form::of(req) {
                    match self.consumer.as_mut() {
                        Some(c) => c.set_form(form),
                        None => self.consumer = Some(Consumer::new(form, self.rendered.clone())),
                    }
                }
                self.reply_after(
                    req.request_id,
                    save.map(Until::SubsGen),
                    S::Subscribed(reply),
                );
                true
            }
            Err(r) => {
                self.error(req.request_id, r.code, r.message);
                false
            }
        }
    }

    fn hello(&mut self, hello: v1::Hello) {
        if hello.protocol_version != proto::PROTOCOL_VERSION {
            self.error(
                0,
                ErrorCode::UnsupportedVersion,
                format!(
                    "protocol version {} is not supported; this bus (busd {}) speaks version {}",
                    hello.protocol_version,
                    proto::BUILD,
                    proto::PROTOCOL_VERSION
                ),
            );
            self.closing = true;
            return;
        }
        self.session.identify(hello.client_pid, &hello.client_name);
        let (state, gen) = self.session.source_state();
        self.source_gen = gen;
        let cfg = self.session.config();
        self.send(S::HelloAck(v1::HelloAck {
            protocol_version: proto::PROTOCOL_VERSION,
            bus_pid: std::process::id(),
            bus_build: proto::BUILD.to_owned(),
            idle_timeout_ms: cfg.idle_timeout.as_millis() as u64,
            source_kind: cfg.source_kind.clone(),
            source_state: Some(state),
            features: proto::FEATURES.iter().map(|f| (*f).to_owned()).collect(),
        }));
        self.phase = Phase::Ready;
    }

    fn stop(&mut self, req: v1::StopRequest) {
        if req.subscription_ids.is_empty() {
            let reply = v1::StopReply {
                request_id: req.request_id,
                consumer_pids: self.session.consumer_pids(),
                bus_stopping: !req.dry_run,
                ..Default::default()
            };
            self.send(S::StopReply(reply));
            if !req.dry_run {
                tracing::info!("stop requested by a client");
                self.session.stop_bus();
            }
        } else {
            let mut reply = self
                .session
                .stop_consumers(&req.subscription_ids, req.dry_run);
            reply.request_id = req.request_id;
            self.send(S::StopReply(reply));
        }
    }

    /// The status document, with its lists cut until it fits in one frame.
    fn status_that_fits(&self) -> String {
        let mut listed = usize::MAX;
        loop {
            let mut doc = self.session.status_json(listed);
            doc["lines"] = serde_json::to_value(self.rendered.stats()).unwrap_or_default();
            let json = doc.to_string();
            if json.len() + 64 <= proto::MAX_FRAME_LEN || listed == 0 {
                return json;
            }
            let doc = self.session.status_json(usize::MAX);
            let n = doc["subscriptions"]
                .as_array()
                .map_or(0, Vec::len)
                .max(doc["consumers"].as_array().map_or(0, Vec::len));
            listed = listed.min(n) / 2;
        }
    }

    fn publish(&mut self, req: v1::Publish) {
        if let Err(m) = Pattern::parse(&req.event_type).and_then(|p| match p {
            Pattern::Exact(_) => Ok(()),
            _ => Err(format!(
                "invalid event type {:?}: wildcards are for subscribing",
                req.event_type
            )),
        }) {
            return self.error(
                req.request_id,
                ErrorCode::BadRequest,
                m.replace("event key", "event type"),
            );
        }
        if req.event_id.len() > MAX_EVENT_ID_LEN {
            return self.error(
                req.request_id,
                ErrorCode::BadRequest,
                format!("event id longer than {MAX_EVENT_ID_LEN} bytes"),
            );
        }
        let event = NewEvent {
            scope: "local".into(),
            event_id: req.event_id,
            event_type: req.event_type,
            source_id: "local".into(),
            data: req.data,
            headers: req.headers.into_iter().collect(),
            event_born_time: crate::clock::now_ms(),
            ..NewEvent::default()
        };
        // A cluster host that does not own the log hands the event to the
        // owner; the reply is the owner's answer. So does an owner while an
        // earlier publish of this connection is still in the inbox (it was
        // forwarded before this host took the lease): the connection's
        // publishes keep their order.
        let forwarding = self.forwards_pending();
        if let Some(link) = self.link.as_ref().filter(|l| !l.is_owner() || forwarding) {
            let ticket = link.forward(event);
            let placeholder = S::PublishAck(v1::PublishAck::default());
            return self.reply_after(req.request_id, Some(Until::Forwarded(ticket)), placeholder);
        }
        let appended = self.session.append(event);
        let appended = match appended {
            Ok(a) => a,
            Err(r) => return self.error(req.request_id, r.code, r.message),
        };
        // The reply waits until the event is durable; later requests are not
        // held up meanwhile.
        let reply = S::PublishAck(v1::PublishAck {
            request_id: req.request_id,
            seq: appended.seq,
            event_id: appended.event_id,
            duplicate: appended.duplicate,
        });
        self.reply_after(req.request_id, Some(Until::Seq(appended.seq)), reply);
    }
}

/// Whether a request keeps the bus up (resets its idle timer): consuming,
/// publishing and changing things do; reading status, an event, the ring's
/// descriptor or a subscription (`show`, `parked`, a dry run), a heartbeat
/// and goodbye do not.
fn counts_as_activity(kind: &C) -> bool {
    match kind {
        C::Subscribe(_) | C::Unsubscribe(_) | C::Ack(_) | C::Publish(_) | C::StopRequest(_) => true,
        C::SubscriptionControl(req) => {
            !req.dry_run && !matches!(req.verb.as_str(), "show" | "parked")
        }
        C::Hello(_)
        | C::Bye(_)
        | C::StatusRequest(_)
        | C::GetEvent(_)
        | C::RingRequest(_)
        | C::Heartbeat(_) => false,
    }
}
