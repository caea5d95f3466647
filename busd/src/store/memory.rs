//! The memory store: keeps nothing. A bus on it loses its log and its
//! subscriptions when it exits, as every bus did before the disk store.

use std::sync::Arc;

use super::{Recovered, Snapshot, Store, StoreError, StoreInfo};
use crate::eventlog::LoggedEvent;

pub struct MemoryStore;

impl Store for MemoryStore {
    fn recover(&mut self) -> Result<Recovered, StoreError> {
        Ok(Recovered::default())
    }
    fn append(&mut self, _: &[Arc<LoggedEvent>]) -> Result<(), StoreError> {
        Ok(())
    }
    fn save(&mut self, _: &Snapshot) -> Result<(), StoreError> {
        Ok(())
    }
    fn release_below(&mut self, _: u64) -> Result<(), StoreError> {
        Ok(())
    }
    fn info(&self) -> StoreInfo {
        StoreInfo {
            kind: "memory",
            durability: "none",
            ..StoreInfo::default()
        }
    }
}
