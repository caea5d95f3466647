//! `dws event publish`: one event, or one event per line of stdin
//! (`--lines`, pipelined over one connection).

use clap::Args;

use super::JsonOnly;

/// Publish events through the bus's local source (starts the bus if needed).
///
/// Prints `{"seq":N,"event_id":"…","duplicate":false}`. Publishing again with
/// the same --id within the dedup window delivers nothing new and prints
/// `"duplicate":true` with the original seq.
///
/// With --lines, each line of stdin is one event's data (as DATA would
/// be), sent in line order, pipelined over one connection; empty lines are
/// skipped. It prints one summary object (lines, published, duplicates,
/// refused, skipped, unanswered, first_seq, last_seq), reports each refused
/// line as `[event] line N refused: …` on stderr and goes on with the next;
/// exit 0 only if every non-empty line was accepted.
#[derive(Debug, Args)]
pub struct PublishArgs {
    /// Event type, e.g. demo.hello.
    #[arg(value_name = "EVENT_TYPE")]
    pub event_type: String,

    /// Payload: a JSON value or raw text; `-` reads stdin. Without it:
    /// stdin when that is a pipe or a file (`echo '{"x":1}' | dws event
    /// publish k`), empty on a terminal.
    #[arg(value_name = "DATA|-", conflicts_with = "lines")]
    pub data: Option<String>,

    /// Event id; makes a retried publish idempotent.
    #[arg(long, value_name = "EVENT_ID", conflicts_with = "lines")]
    pub id: Option<String>,

    /// Publish one event per line of stdin, pipelined (several in flight);
    /// empty lines are skipped.
    #[arg(long)]
    pub lines: bool,

    /// With --lines: line N's event id is PREFIX-N (N counts every line
    /// from 1, empty ones too), so running the same input again publishes
    /// only what is not already in the dedup window.
    #[arg(long, value_name = "PREFIX")]
    pub id_prefix: Option<String>,

    /// json (the only format): the reply as one JSON object
    /// (schemas/publish.schema.json; with --lines schemas/publish-lines.schema.json).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = JsonOnly::Json)]
    pub format: JsonOnly,
}
