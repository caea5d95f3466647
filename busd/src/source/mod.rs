//! Upstream sources, one file each, behind the [`Source`] trait. A source
//! turns its upstream into [`crate::hub::NewEvent`]s appended to the hub and
//! reports its state with [`crate::hub::Hub::set_source_state`]. Only code in
//! this module does upstream I/O.

pub mod dingtalk;
pub mod exec;
pub mod local;
pub mod personal;
pub mod stream;

use std::{future::Future, pin::Pin};

use crate::{hub::Hub, shutdown::Shutdown};

/// What every source gets: where events go and when to stop.
pub struct SourceContext {
    pub hub: Hub,
    pub shutdown: Shutdown,
}

pub type SourceFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A boxed future, for the object-safe async methods below.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The upstream subscription control plane of a source that has one (the
/// personal stream). The hub calls it when a local subscription is created
/// and removed; identical upstream specs share one upstream subscription by
/// reference count, which the implementation keeps.
pub trait UpstreamControl: Send + Sync {
    /// Binds a new local subscription (event keys, upstream spec, TTL) to an
    /// upstream subscription, creating it if needed; returns its upstream id.
    /// `ttl` is the TTL the user asked for explicitly, zero when none: only
    /// then does the upstream subscription get an expiry.
    /// A refusal reaches the consumer as an `Error` frame before any ready line.
    fn acquire<'a>(
        &'a self,
        keys: &'a [String],
        spec: &'a proto::v1::UpstreamSpec,
        ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<String, crate::hub::Refusal>>;

    /// A local subscription bound to `upstream_id` is gone; the last one
    /// cancels the upstream subscription (in the background).
    fn release(&self, upstream_id: &str);
}

pub trait Source: Send {
    /// Short name shown by status and HelloAck (`local`, `exec`, …).
    fn kind(&self) -> &'static str;

    /// Runs until `ctx.shutdown` fires. A source whose upstream is gone for
    /// good sets the state `lost` and triggers the shutdown with SOURCE_LOST.
    fn run(self: Box<Self>, ctx: SourceContext) -> SourceFuture;

    /// The source's upstream subscription control plane, if it has one.
    fn upstream_control(&self) -> Option<std::sync::Arc<dyn UpstreamControl>> {
        None
    }
}

/// Builds the source a profile is configured for.
pub fn from_config(config: &crate::profile::SourceConfig) -> Box<dyn Source> {
    use crate::profile::SourceConfig as C;
    match config {
        C::Local => Box::new(local::LocalSource),
        C::Exec(c) => Box::new(exec::ExecSource { config: c.clone() }),
        C::DingTalk(c) => Box::new(dingtalk::DingTalkSource { config: c.clone() }),
        C::Personal(c) => Box::new(personal::PersonalSource::new(c.clone())),
    }
}
