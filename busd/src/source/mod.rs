//! Upstream sources, one file each, behind the [`Source`] trait. A source
//! turns its upstream into [`crate::hub::NewEvent`]s appended to the hub and
//! reports its state with [`crate::hub::Hub::set_source_state`]. Only code in
//! this module does upstream I/O.

pub mod local;

use std::{future::Future, pin::Pin};

use crate::{hub::Hub, shutdown::Shutdown};

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
}
