//! What a failed scenario leaves behind for its diagnosis: each host's
//! directory (bus logs, state files, `runs-<sub>.log` of every consumer
//! run), the whole recorded history, the faults done, the server's log and
//! the cluster's tables, copied under `DWS_FAULT_KEEP` (default
//! `/tmp/dws-faults-kept`) in `<scenario>-<seed>/`, before the scenario's
//! temp dirs are removed.

use std::{path::PathBuf, process::Command, sync::Arc};

use dws_tests::{history::History, pg::PgServer};

use crate::workload::Host;

/// The cluster's tables as the diagnosis reads them, one file each.
const TABLES: [(&str, &str); 6] = [
    (
        "dws_event",
        "SELECT seq, scope, event_id, event_type, route, received_unix_ms FROM dws_event ORDER BY seq",
    ),
    ("dws_cluster", "SELECT * FROM dws_cluster"),
    ("dws_claim", "SELECT * FROM dws_claim ORDER BY seq"),
    (
        "dws_inbox",
        "SELECT id, host, created_at, taken_epoch, done, done_at, seq, duplicate, event_id, error, \
         event::text FROM dws_inbox ORDER BY id",
    ),
    (
        "dws_cursor",
        "SELECT subscription, host, saved_at, record::text FROM dws_cursor",
    ),
    ("dws_host", "SELECT * FROM dws_host"),
];

/// Copies everything a diagnosis needs; returns where, or why not.
pub fn keep(
    name: &str,
    seed: u64,
    history: &History,
    server: &PgServer,
    hosts: &[Arc<Host>],
    faults: &[String],
) -> String {
    let base = std::env::var_os("DWS_FAULT_KEEP")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/dws-faults-kept"));
    let dir = base.join(format!("{name}-{seed}"));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return format!("not kept: cannot create {}: {e}", dir.display());
    }
    for h in hosts {
        let _ = Command::new("cp")
            .arg("-a")
            .arg(h.env.root())
            .arg(dir.join(&h.name))
            .status();
    }
    let _ = std::fs::copy(server.dir().join("postgres.log"), dir.join("postgres.log"));
    let _ = std::fs::write(dir.join("history.txt"), format!("{history:#?}"));
    let _ = std::fs::write(dir.join("faults.txt"), faults.join("\n"));
    for (table, sql) in TABLES {
        let rows = std::panic::catch_unwind(|| server.psql(sql))
            .unwrap_or_else(|_| format!("cannot read {table}"));
        let _ = std::fs::write(dir.join(format!("{table}.txt")), rows);
    }
    format!("kept in {}", dir.display())
}
