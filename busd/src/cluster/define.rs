//! One definition per named subscription, cluster-wide: before a host
//! creates a named subscription it does not hold, it claims the id in
//! `dws_subscription` ([`definitions::claim_definition`]: insert unless present,
//! then read what is there). The primary key decides between hosts creating
//! the same id at the same instant; whoever finds a definition with other
//! keys or another filter is refused exactly like re-subscribing with
//! different keys on one host (exit 2), and the winner's definition reaches
//! every host through adoption.

use std::sync::Arc;

use proto::v1::{self, ErrorCode};

use super::Link;
use crate::{
    clock::now_ms,
    hub::ReplicaPort,
    pattern::Selector,
    pg::definitions,
    store::{SubCounters, SubRecord},
    subscription::poison_name,
    upstream::Refusal,
};

impl Link {
    /// Claims the definition of the named subscription `req` creates, if it
    /// creates one on this host; refuses when the cluster already defines it
    /// differently. Requests that create nothing here (an ephemeral or
    /// existing subscription, an invalid one the hub refuses anyway) pass.
    /// `true`: this call made the definition (give it back with
    /// [`Link::release_definition`] if the request is refused after all).
    pub async fn claim_definition(&self, req: &v1::Subscribe) -> Result<bool, Refusal> {
        let hub = &self.hub;
        let id = req.subscription_id.as_str();
        if req.owned || req.must_exist || !proto::is_valid_id(id) || hub.has_subscription(id) {
            return Ok(false);
        }
        let Ok(wanted) =
            Selector::new(&req.patterns, &req.filter).and_then(|s| s.with_where(&req.where_exprs))
        else {
            return Ok(false);
        };
        let record = definition_record(hub, req, &wanted);
        let (inserted, stored) = self.claim(&record).await.map_err(|e| {
            Refusal::new(
                ErrorCode::Internal,
                format!("cannot check subscription {id}'s definition in the cluster: {e}"),
            )
        })?;
        let have = Selector::stored(&stored.patterns, &stored.filter)
            .and_then(|s| s.with_where(&stored.where_exprs));
        let where_notes = match &have {
            Ok(have) if have.same_spec(&wanted) => return Ok(inserted),
            Ok(have) => (have.where_note(&wanted), wanted.where_note(have)),
            Err(_) => (String::new(), String::new()),
        };
        Err(Refusal::new(
            ErrorCode::BadRequest,
            format!(
                "subscription {id} exists with event keys {} and filter {:?}{} (defined in the \
                 cluster); this request asks for {} and {:?}{}",
                stored.patterns.join(","),
                stored.filter,
                where_notes.0,
                wanted.pattern_strings().join(","),
                wanted.filter_str(),
                where_notes.1,
            ),
        ))
    }

    /// Inserts `record` as the definition unless one exists; returns whether
    /// it did, and the cluster's definition either way.
    async fn claim(&self, record: &SubRecord) -> Result<(bool, SubRecord), crate::pg::PgError> {
        let (client, _driver) = crate::pg::connect(&self.settings, "define").await?;
        let json = serde_json::to_string(record)
            .map_err(|e| crate::pg::PgError::Other(format!("cannot encode the definition: {e}")))?;
        definitions::claim_definition::<SubRecord>(
            &client,
            &self.settings.cluster,
            &record.id,
            record.shared,
            &json,
        )
        .await
    }

    /// Gives back a definition [`Link::claim_definition`] made for a request
    /// that was refused after all, unless a host holds it by now (has a
    /// cursor of it): in the background, on its own session; a failure
    /// leaves the definition, which the next save of a host holding it
    /// would have written anyway.
    pub fn release_definition(self: Arc<Self>, id: String) {
        tokio::spawn(async move {
            let released = async {
                let (client, _driver) = crate::pg::connect(&self.settings, "define").await?;
                definitions::release_definition(&client, &self.settings.cluster, &id).await
            };
            if let Err(e) = released.await {
                tracing::warn!(subscription = %id, cause = %e, "cannot give back a definition");
            }
        });
    }
}

/// The definition this host would save for `req`: its spec, starting where
/// the hub's new subscription would.
fn definition_record(hub: &ReplicaPort, req: &v1::Subscribe, selector: &Selector) -> SubRecord {
    let head = hub.head_seq();
    let start_after = match v1::StartPosition::try_from(req.start).unwrap_or_default() {
        v1::StartPosition::StartLatest => head,
        v1::StartPosition::StartEarliest => 0,
        v1::StartPosition::StartSeq => req.start_seq.saturating_sub(1),
        v1::StartPosition::StartTime => hub.seq_at_time(req.start_unix_ms).saturating_sub(1),
    };
    let ttl = crate::hub::requested_ttl(req, hub.config().default_ttl);
    let now = now_ms();
    let spec = SubRecord {
        id: req.subscription_id.clone(),
        patterns: selector.pattern_strings(),
        filter: selector.filter_str().to_owned(),
        ttl_ms: proto::limits::ttl_to_ms(ttl),
        created_at_unix_ms: now,
        upstream_id: None,
        cursor: start_after,
        pinned: vec![],
        max_sent_seq: start_after,
        gap_lost: 0,
        detached_since_unix_ms: Some(now),
        counters: SubCounters::default(),
        max_deliver: req.max_deliver,
        on_poison: poison_name(v1::PoisonPolicy::try_from(req.on_poison).unwrap_or_default())
            .into(),
        state: "active".into(),
        halt: None,
        deliveries: vec![],
        parked: vec![],
        acked: vec![],
        shared: req.shared,
        backoff_ms: req.backoff_ms.clone(),
        delayed: vec![],
        // Where a shared subscription starts on every host.
        shared_from: if req.shared { start_after } else { 0 },
        where_exprs: selector.where_strs().to_vec(),
        ack_wait_ms: (req.default_ack_wait_ms > 0).then_some(req.default_ack_wait_ms),
    };
    spec.instance_for_host(now)
}
