//! Upstream sources, one file each, behind the [`Source`] trait. A source
//! turns its upstream into [`crate::hub::NewEvent`]s appended to the hub and
//! reports its state with [`crate::hub::Hub::set_source_state`]. Only code in
//! this module does upstream I/O. A source with upstream subscriptions hands
//! the hub an [`UpstreamControl`] (defined in [`crate::upstream`], the one
//! boundary both sides depend on: sources use the hub's handle, the hub
//! never uses this module).

pub mod dingtalk;
pub mod exec;
pub mod local;
pub mod personal;
pub mod stream;

use std::{future::Future, pin::Pin};

use crate::{hub::Hub, shutdown::Shutdown, upstream::UpstreamControl};

/// What every source gets: where events go and when to stop.
pub struct SourceContext {
    pub hub: Hub,
    pub shutdown: Shutdown,
}

pub type SourceFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

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
