//! Upstream sources, one file each, behind the [`Source`] trait. A source
//! turns its upstream into [`crate::hub::NewEvent`]s appended to the hub and
//! reports its state with [`crate::hub::SourceHandle::set_source_state`]. Only code in
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

use self::{dingtalk::DingTalkConfig, exec::ExecConfig, personal::config::PersonalConfig};
use crate::{hub::SourceHandle, shutdown::Shutdown, upstream::UpstreamControl};

/// What every source gets: where events go and when to stop. The hub is
/// reached only through its [`SourceHandle`].
pub struct SourceContext {
    pub hub: SourceHandle,
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

/// The source a profile's bus runs, with its settings (each source's
/// settings are read next to that source: `source::exec::settings`,
/// `source::dingtalk::settings`, `source::personal::config::settings`).
#[derive(Debug, Clone)]
pub enum SourceConfig {
    Local,
    Exec(ExecConfig),
    DingTalk(DingTalkConfig),
    Personal(PersonalConfig),
}

impl SourceConfig {
    pub fn kind(&self) -> &'static str {
        match self {
            SourceConfig::Local => "local",
            SourceConfig::Exec(_) => "exec",
            SourceConfig::DingTalk(_) => "dingtalk",
            SourceConfig::Personal(_) => "personal",
        }
    }
}

/// Builds the source a profile is configured for.
pub fn from_config(config: &SourceConfig) -> Box<dyn Source> {
    use SourceConfig as C;
    match config {
        C::Local => Box::new(local::LocalSource),
        C::Exec(c) => Box::new(exec::ExecSource { config: c.clone() }),
        C::DingTalk(c) => Box::new(dingtalk::DingTalkSource { config: c.clone() }),
        C::Personal(c) => Box::new(personal::PersonalSource::new(c.clone())),
    }
}
