//! The cluster's coordination in PostgreSQL, beside the log the store
//! owns: the upstream owner's lease ([`lease`]), followers' publishes for
//! the owner ([`inbox`]), shared delivery's claims ([`claims`]) and the
//! hosts with their cursors, for status ([`hosts`]). Only `cluster` uses
//! these; the store (`store::postgres`) never does.

pub mod claims;
pub mod hosts;
pub mod inbox;
pub mod lease;
