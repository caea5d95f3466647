//! The `local` source: events published by clients (`dws event publish`).
//! Publish frames are appended by the connection that receives them, so this
//! source has no upstream of its own: it is connected from the start.

use proto::v1;

use super::{Source, SourceContext, SourceFuture};

pub struct LocalSource;

impl Source for LocalSource {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn run(self: Box<Self>, mut ctx: SourceContext) -> SourceFuture {
        Box::pin(async move {
            ctx.hub.set_source_state(
                v1::SourceState {
                    state: v1::SourceStatus::Connected as i32,
                    since_unix_ms: crate::clock::now_ms(),
                    ..Default::default()
                },
                None,
            );
            ctx.shutdown.recv().await;
        })
    }
}
