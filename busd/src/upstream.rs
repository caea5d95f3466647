//! The upstream-control boundary, between the hub and the sources: the
//! [`UpstreamControl`] trait a source with upstream subscriptions (the
//! personal stream) implements, the [`UpstreamId`] it hands out, and
//! [`Refusal`], the refused request both sides return.
//!
//! Who calls what: a connection [`UpstreamControl::acquire`]s an upstream
//! subscription before it asks the hub to create a local one bound to it
//! (`Session::upstream_for`, `Session::subscribe`); the hub
//! [`UpstreamControl::release`]s it when that local subscription is not
//! created after all, is removed, or expires. The hub depends only on this
//! module, never on the sources; sources use the hub's handle API.

use std::{future::Future, pin::Pin, time::Duration};

use proto::v1::{ErrorCode, UpstreamSpec};

/// The id of an upstream subscription, as the upstream gave it.
pub type UpstreamId = String;

/// A boxed future, for the object-safe async methods of [`UpstreamControl`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A request that was refused, with the code for the `Error` frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
}

impl Refusal {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
        }
    }
}

/// The upstream subscription control plane of a source that has one (the
/// personal stream). Identical upstream specs share one upstream
/// subscription by reference count, which the implementation keeps.
pub trait UpstreamControl: Send + Sync {
    /// Binds a new local subscription (event keys, upstream spec, TTL) to an
    /// upstream subscription, creating it if needed; returns its upstream id.
    /// `ttl` is the TTL the user asked for explicitly, zero when none: only
    /// then does the upstream subscription get an expiry.
    /// A refusal reaches the consumer as an `Error` frame before any ready line.
    fn acquire<'a>(
        &'a self,
        keys: &'a [String],
        spec: &'a UpstreamSpec,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<UpstreamId, Refusal>>;

    /// A local subscription bound to `upstream_id` is gone; the last one
    /// cancels the upstream subscription (in the background).
    fn release(&self, upstream_id: &str);
}
