//! `dws event status --format prometheus|openmetrics`: the status document
//! as metrics text, for node_exporter's textfile collector or a cron job.
//!
//! Pure: a [`StatusDoc`] (or "no bus") in, the exposition text out. Every
//! sample carries the profile as a label, so several profiles' files can
//! sit in one textfile directory. The two formats differ only in how a
//! counter family is named (`x_total` in the Prometheus text format 0.0.4,
//! family `x` with sample `x_total` in OpenMetrics) and in OpenMetrics'
//! closing `# EOF`.
//!
//! The bus cuts its subscription list to fit one frame: `dws_status_truncated`
//! says so (1), and the `dws_subscriptions*` totals, which busd counts over
//! every subscription, still count the ones left out.

use std::fmt::Write as _;

use proto::status::{StatusDoc, SubscriptionTotalsDoc};

/// Which exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// The Prometheus text format 0.0.4.
    Prometheus,
    /// OpenMetrics 1.0 text.
    OpenMetrics,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gauge,
    Counter,
    Histogram,
}

/// Collects samples grouped by family, then writes them.
struct Families {
    flavor: Flavor,
    profile: String,
    /// (name, kind, help, samples as `{labels} value`).
    list: Vec<(&'static str, Kind, &'static str, Vec<String>)>,
}

impl Families {
    /// One sample: `suffix` goes after the sample's name (a histogram's
    /// `_bucket`, `_sum`, `_count`; empty otherwise).
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        name: &'static str,
        kind: Kind,
        help: &'static str,
        suffix: &str,
        labels: &[(&str, &str)],
        value: f64,
    ) {
        let mut l = format!("profile=\"{}\"", escape(&self.profile));
        for (k, v) in labels {
            let _ = write!(l, ",{k}=\"{}\"", escape(v));
        }
        let sample = format!("{suffix}{{{l}}} {}", number(value));
        match self.list.iter_mut().find(|f| f.0 == name) {
            Some(f) => f.3.push(sample),
            None => self.list.push((name, kind, help, vec![sample])),
        }
    }

    fn gauge(&mut self, name: &'static str, help: &'static str, labels: &[(&str, &str)], v: f64) {
        self.add(name, Kind::Gauge, help, "", labels, v);
    }

    /// `name` without `_total`: the suffix is added to the samples.
    fn counter(&mut self, name: &'static str, help: &'static str, labels: &[(&str, &str)], v: f64) {
        self.add(name, Kind::Counter, help, "", labels, v);
    }

    fn finish(self) -> String {
        let mut o = String::new();
        for (name, kind, help, samples) in &self.list {
            let (family, sample, kind) = match (kind, self.flavor) {
                (Kind::Gauge, _) => (name.to_string(), name.to_string(), "gauge"),
                (Kind::Counter, Flavor::Prometheus) => {
                    (format!("{name}_total"), format!("{name}_total"), "counter")
                }
                (Kind::Counter, Flavor::OpenMetrics) => {
                    (name.to_string(), format!("{name}_total"), "counter")
                }
                // Samples carry their own suffix (`_bucket`, `_sum`, `_count`).
                (Kind::Histogram, _) => (name.to_string(), name.to_string(), "histogram"),
            };
            let _ = writeln!(o, "# HELP {family} {help}");
            let _ = writeln!(o, "# TYPE {family} {kind}");
            for s in samples {
                let _ = writeln!(o, "{sample}{s}");
            }
        }
        if self.flavor == Flavor::OpenMetrics {
            o.push_str("# EOF\n");
        }
        o
    }
}

/// A label value as the formats quote it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn flag(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// The metrics of a running bus.
pub fn render(doc: &StatusDoc, flavor: Flavor) -> String {
    let mut f = Families {
        flavor,
        profile: doc.bus.profile.clone(),
        list: vec![],
    };
    let (bus, src, log, store) = (&doc.bus, &doc.source, &doc.log, &doc.store);
    f.gauge("dws_bus_up", "1 while the bus answers status.", &[], 1.0);
    f.gauge(
        "dws_bus_uptime_seconds",
        "Seconds since the bus started.",
        &[],
        bus.uptime_ms as f64 / 1000.0,
    );
    f.gauge(
        "dws_bus_connections",
        "Client connections open now.",
        &[],
        bus.connections as f64,
    );
    let r = &bus.refused;
    for (reason, n) in [
        ("connections", r.connections),
        ("input_budget", r.input_budget),
        ("slow_clients", r.slow_clients),
        ("bad_frames", r.bad_frames),
        ("too_large_events", r.too_large_events),
    ] {
        f.counter(
            "dws_bus_refused",
            "Clients or requests the bus refused, by reason.",
            &[("reason", reason)],
            n as f64,
        );
    }
    f.gauge(
        "dws_source_connected",
        "1 while the upstream source is connected.",
        &[("kind", &src.kind)],
        flag(src.state == "connected"),
    );
    f.gauge(
        "dws_source_state",
        "The upstream source's state (1 for the current one).",
        &[("kind", &src.kind), ("state", &src.state)],
        1.0,
    );
    f.counter(
        "dws_source_reconnects",
        "Times the upstream source reconnected.",
        &[("kind", &src.kind)],
        src.reconnects as f64,
    );
    f.gauge(
        "dws_log_head_seq",
        "Seq of the newest event.",
        &[],
        log.head_seq as f64,
    );
    f.gauge("dws_log_events", "Events retained.", &[], log.events as f64);
    f.gauge(
        "dws_log_bytes",
        "Bytes of events retained.",
        &[],
        log.bytes as f64,
    );
    f.gauge(
        "dws_log_max_bytes",
        "Retention bound in bytes.",
        &[],
        log.max_bytes as f64,
    );
    f.gauge(
        "dws_log_max_events",
        "Retention bound in events.",
        &[],
        log.max_events as f64,
    );
    f.gauge(
        "dws_store_bytes",
        "Bytes the store holds on disk.",
        &[("kind", &store.kind)],
        store.bytes as f64,
    );
    f.gauge(
        "dws_store_segments",
        "Segment files of the store.",
        &[("kind", &store.kind)],
        store.segments as f64,
    );
    f.gauge(
        "dws_store_damaged_ranges",
        "Damaged seq ranges found in the store.",
        &[("kind", &store.kind)],
        store.damaged.len() as f64,
    );
    f.gauge(
        "dws_store_failed",
        "1 when the store reported an error (the bus stops accepting events).",
        &[("kind", &store.kind)],
        flag(store.last_error.is_some()),
    );
    let lat = &store.append_latency;
    if lat.le_us.len() == lat.cumulative.len() {
        const NAME: &str = "dws_store_append_seconds";
        const HELP: &str = "How long each append to the store took (write and fdatasync).";
        let kind = [("kind", store.kind.as_str())];
        let h = Kind::Histogram;
        for (le, n) in lat.le_us.iter().zip(&lat.cumulative) {
            let le = number(*le as f64 / 1e6);
            let labels = [kind[0], ("le", le.as_str())];
            f.add(NAME, h, HELP, "_bucket", &labels, *n as f64);
        }
        let labels = [kind[0], ("le", "+Inf")];
        f.add(NAME, h, HELP, "_bucket", &labels, lat.count as f64);
        f.add(NAME, h, HELP, "_sum", &kind, lat.sum_us as f64 / 1e6);
        f.add(NAME, h, HELP, "_count", &kind, lat.count as f64);
    }
    f.gauge(
        "dws_status_truncated",
        "1 when the bus cut its lists to fit one frame: per-subscription series are missing \
         for some; the dws_subscriptions totals count all.",
        &[],
        flag(doc.truncated.is_some()),
    );
    // An older bus sends no totals: the list's own, when it is complete.
    let totals = match (&doc.subscription_totals, &doc.truncated) {
        (Some(t), _) => Some(t.clone()),
        (None, None) => Some(SubscriptionTotalsDoc::of(&doc.subscriptions)),
        (None, Some(_)) => None,
    };
    if let Some(t) = totals {
        for (name, help, v) in [
            (
                "dws_subscriptions",
                "Subscriptions the bus holds (all, listed or not).",
                t.count,
            ),
            (
                "dws_subscriptions_attached",
                "Subscriptions with a consumer attached.",
                t.attached,
            ),
            (
                "dws_subscriptions_halted",
                "Subscriptions halted at a poison event, over all of them.",
                t.halted,
            ),
            (
                "dws_subscriptions_disabled",
                "Subscriptions disabled, over all of them.",
                t.disabled,
            ),
            (
                "dws_subscriptions_pending_events",
                "Events not yet acked, summed over every subscription.",
                t.pending,
            ),
            (
                "dws_subscriptions_parked_events",
                "Poison events parked, summed over every subscription.",
                t.parked,
            ),
        ] {
            f.gauge(name, help, &[], v as f64);
        }
    }
    for s in &doc.subscriptions {
        let id = [("subscription", s.id.as_str())];
        let g = |f: &mut Families, name, help, v: u64| f.gauge(name, help, &id, v as f64);
        g(
            &mut f,
            "dws_subscription_lag",
            "Events after the cursor not yet delivered.",
            s.lag,
        );
        g(
            &mut f,
            "dws_subscription_pending",
            "Events not yet acked.",
            s.pending,
        );
        g(
            &mut f,
            "dws_subscription_in_flight",
            "Events delivered and not yet acked.",
            s.in_flight,
        );
        g(
            &mut f,
            "dws_subscription_parked",
            "Poison events parked.",
            s.parked,
        );
        g(
            &mut f,
            "dws_subscription_delayed",
            "Events waiting for their backoff.",
            s.delayed,
        );
        f.gauge(
            "dws_subscription_halted",
            "1 while the subscription is halted at a poison event.",
            &id,
            flag(s.state == "halted"),
        );
        f.gauge(
            "dws_subscription_disabled",
            "1 while the subscription is disabled.",
            &id,
            flag(s.state == "disabled"),
        );
        f.gauge(
            "dws_subscription_attached",
            "1 while a consumer is attached.",
            &id,
            flag(s.attached_pid.is_some()),
        );
        f.gauge(
            "dws_subscription_consumers",
            "Consumers attached (several only with shared delivery).",
            &id,
            s.consumers as f64,
        );
        f.gauge(
            "dws_subscription_oldest_unacked_age_seconds",
            "Age of the oldest unacked delivery (0 when none).",
            &id,
            s.oldest_unacked_age_ms.unwrap_or(0).max(0) as f64 / 1000.0,
        );
        let c = |f: &mut Families, name, help, v: u64| f.counter(name, help, &id, v as f64);
        c(
            &mut f,
            "dws_subscription_delivered",
            "Deliveries, first or again.",
            s.delivered,
        );
        c(&mut f, "dws_subscription_acked", "Events acked.", s.acked);
        c(
            &mut f,
            "dws_subscription_redelivered",
            "Events delivered again.",
            s.redelivered,
        );
        c(
            &mut f,
            "dws_subscription_lost_to_retention",
            "Events retention evicted before this subscription delivered them.",
            s.lost_to_retention,
        );
        c(
            &mut f,
            "dws_subscription_parked_dropped",
            "Parked events dropped.",
            s.parked_dropped,
        );
    }
    // Each consumer on its own (a shared subscription's workers).
    for c in &doc.consumers {
        let pid = c.pid.to_string();
        let labels = [
            ("subscription", c.subscription_id.as_str()),
            ("pid", pid.as_str()),
        ];
        f.gauge(
            "dws_consumer_in_flight",
            "Events delivered to this consumer and not yet settled.",
            &labels,
            c.in_flight as f64,
        );
        f.counter(
            "dws_consumer_delivered",
            "Deliveries to this consumer.",
            &labels,
            c.delivered as f64,
        );
        f.counter(
            "dws_consumer_redelivered",
            "Of them, deliveries marked redelivered.",
            &labels,
            c.redelivered as f64,
        );
        f.counter(
            "dws_consumer_acked",
            "Events this consumer acked.",
            &labels,
            c.acked as f64,
        );
    }
    f.finish()
}

/// The metrics when no bus answers: only `dws_bus_up 0`.
pub fn render_not_running(profile: &str, flavor: Flavor) -> String {
    let mut f = Families {
        flavor,
        profile: profile.to_owned(),
        list: vec![],
    };
    f.gauge("dws_bus_up", "1 while the bus answers status.", &[], 0.0);
    f.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::status::SubscriptionStatus;

    fn doc() -> StatusDoc {
        let mut d = StatusDoc {
            running: true,
            ..Default::default()
        };
        d.bus.profile = "de\"v".into();
        d.source.kind = "local".into();
        d.source.state = "connected".into();
        d.subscriptions.push(SubscriptionStatus {
            id: "s1".into(),
            lag: 7,
            redelivered: 2,
            state: "halted".into(),
            ..Default::default()
        });
        d
    }

    #[test]
    fn prometheus_names_counters_with_total_in_the_type_line() {
        let t = render(&doc(), Flavor::Prometheus);
        assert!(
            t.contains("# TYPE dws_subscription_redelivered_total counter\n"),
            "{t}"
        );
        assert!(t.contains(
            "dws_subscription_redelivered_total{profile=\"de\\\"v\",subscription=\"s1\"} 2\n"
        ));
        assert!(t.contains("dws_subscription_lag{profile=\"de\\\"v\",subscription=\"s1\"} 7\n"));
        assert!(t.contains("dws_subscription_halted{profile=\"de\\\"v\",subscription=\"s1\"} 1\n"));
        assert!(!t.contains("# EOF"));
        // One HELP and TYPE per family, before its samples.
        assert_eq!(t.matches("# TYPE dws_subscription_lag gauge").count(), 1);
    }

    #[test]
    fn openmetrics_names_the_counter_family_without_total_and_ends_with_eof() {
        let t = render(&doc(), Flavor::OpenMetrics);
        assert!(
            t.contains("# TYPE dws_subscription_redelivered counter\n"),
            "{t}"
        );
        assert!(t.contains("dws_subscription_redelivered_total{"));
        assert!(t.ends_with("# EOF\n"));
    }

    #[test]
    fn the_append_latency_is_a_histogram_with_le_buckets_sum_and_count() {
        let mut d = doc();
        d.store.kind = "disk".into();
        d.store.append_latency = proto::status::LatencyDoc {
            le_us: vec![100, 1_000],
            cumulative: vec![1, 3],
            sum_us: 2_500,
            count: 4,
        };
        let t = render(&d, Flavor::Prometheus);
        let p = "profile=\"de\\\"v\",kind=\"disk\"";
        for line in [
            "# TYPE dws_store_append_seconds histogram".to_owned(),
            format!("dws_store_append_seconds_bucket{{{p},le=\"0.0001\"}} 1"),
            format!("dws_store_append_seconds_bucket{{{p},le=\"0.001\"}} 3"),
            format!("dws_store_append_seconds_bucket{{{p},le=\"+Inf\"}} 4"),
            format!("dws_store_append_seconds_sum{{{p}}} 0.0025"),
            format!("dws_store_append_seconds_count{{{p}}} 4"),
        ] {
            assert!(t.lines().any(|l| l == line), "{line:?} missing in\n{t}");
        }
    }

    #[test]
    fn a_cut_list_is_flagged_and_the_totals_count_every_subscription() {
        let mut d = doc();
        let t = render(&d, Flavor::Prometheus);
        let p = "{profile=\"de\\\"v\"}";
        for line in [
            format!("dws_status_truncated{p} 0"),
            // No totals from the bus, a complete list: its own.
            format!("dws_subscriptions{p} 1"),
            format!("dws_subscriptions_halted{p} 1"),
        ] {
            assert!(t.lines().any(|l| l == line), "{line:?} missing in\n{t}");
        }
        d.truncated = Some(proto::status::TruncatedDoc {
            consumers_total: 0,
            subscriptions_total: 401,
        });
        let t = render(&d, Flavor::Prometheus);
        assert!(t.contains(&format!("dws_status_truncated{p} 1\n")), "{t}");
        assert!(!t.contains("dws_subscriptions{"), "no totals to trust: {t}");
        d.subscription_totals = Some(SubscriptionTotalsDoc {
            count: 401,
            halted: 2,
            parked: 5,
            ..Default::default()
        });
        let t = render(&d, Flavor::Prometheus);
        for line in [
            format!("dws_subscriptions{p} 401"),
            format!("dws_subscriptions_halted{p} 2"),
            format!("dws_subscriptions_parked_events{p} 5"),
        ] {
            assert!(t.lines().any(|l| l == line), "{line:?} missing in\n{t}");
        }
    }

    #[test]
    fn no_bus_is_bus_up_zero() {
        let t = render_not_running("default", Flavor::Prometheus);
        assert!(t.contains("dws_bus_up{profile=\"default\"} 0\n"), "{t}");
    }
}
