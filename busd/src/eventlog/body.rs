//! An event's encoded bytes as the log holds them: resident in memory while
//! the event is in the log's hot tail (or always, on a store that keeps no
//! files), else read back on each use from its record in a disk store
//! segment ([`ColdRef`], through the store's [`ColdSource`]).
//!
//! A read of a cold body can fail (an I/O error, a record that no longer
//! checks out): that is a store failure, reported through
//! [`note_read_failure`] and [`take_read_failure`] so that the bus stops
//! with the store-failed contract, as when an append fails.

use std::{
    fmt,
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard, OnceLock},
};

use bytes::Bytes;

/// Reads event bodies back from a store's files.
pub trait ColdSource: Send + Sync + fmt::Debug {
    /// The last `len` bytes of the payload of the record at `at` in
    /// `segment` (a payload of `payload_len` bytes), checked against the
    /// record's checksum.
    fn read(&self, r: &ColdRef, len: usize) -> std::io::Result<Bytes>;
}

/// Where an event's record lies in a segment.
#[derive(Debug, Clone)]
pub struct ColdRef {
    pub source: Arc<dyn ColdSource>,
    pub segment: Arc<PathBuf>,
    /// Byte offset of the record (its header) in the segment.
    pub at: u64,
    pub payload_len: u32,
}

/// Why a cold body could not be read: the store failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError(pub String);

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ReadError {}

/// The first cold read that failed in this process, until the committer
/// takes it.
static READ_FAILURE: Mutex<Option<String>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records that a read of the store failed (the committer stops the bus).
pub fn note_read_failure(why: &str) {
    let mut f = lock(&READ_FAILURE);
    if f.is_none() {
        *f = Some(why.to_owned());
    }
}

/// The read failure noted since the last call, if any.
pub fn take_read_failure() -> Option<String> {
    lock(&READ_FAILURE).take()
}

/// A value computed on first need and dropped when the event cools.
#[derive(Debug)]
pub struct Cached<T>(Mutex<Option<T>>);

impl<T> Default for Cached<T> {
    fn default() -> Self {
        Cached(Mutex::new(None))
    }
}

impl<T: Clone> Cached<T> {
    /// The cached value, or `make()`'s, kept only when `keep`.
    pub fn get_or(&self, keep: bool, make: impl FnOnce() -> T) -> T {
        let mut c = lock(&self.0);
        if let Some(v) = c.as_ref() {
            return v.clone();
        }
        let v = make();
        if keep {
            *c = Some(v.clone());
        }
        v
    }

    /// The cached value, if any.
    pub fn peek(&self) -> Option<T> {
        lock(&self.0).clone()
    }

    pub fn clear(&self) {
        lock(&self.0).take();
    }
}

/// An event's encoded `v1::Event`: resident, or on disk once cooled.
#[derive(Debug, Default)]
pub struct Body {
    len: usize,
    resident: Mutex<Option<Bytes>>,
    cold: OnceLock<ColdRef>,
}

impl From<Bytes> for Body {
    fn from(b: Bytes) -> Body {
        Body {
            len: b.len(),
            resident: Mutex::new(Some(b)),
            cold: OnceLock::new(),
        }
    }
}

impl From<Vec<u8>> for Body {
    fn from(v: Vec<u8>) -> Body {
        Body::from(Bytes::from(v))
    }
}

impl Body {
    /// A body that is on disk only.
    pub fn cold(len: usize, r: ColdRef) -> Body {
        Body {
            len,
            resident: Mutex::new(None),
            cold: OnceLock::from(r),
        }
    }

    /// Bytes of the encoded event, resident or not.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes: resident, else read from the store.
    pub fn get(&self) -> Result<Bytes, ReadError> {
        if let Some(b) = lock(&self.resident).as_ref() {
            return Ok(b.clone());
        }
        match self.cold.get() {
            Some(r) => r.source.read(r, self.len).map_err(|e| {
                let why = format!(
                    "cannot read an event back from {} (offset {}): {e}",
                    r.segment.display(),
                    r.at
                );
                note_read_failure(&why);
                ReadError(why)
            }),
            None => Ok(Bytes::new()),
        }
    }

    /// Where the bytes are on disk (set by the store once they are durable).
    pub fn set_cold(&self, r: ColdRef) {
        let _ = self.cold.set(r);
    }

    pub fn is_resident(&self) -> bool {
        lock(&self.resident).is_some()
    }

    /// Drops the resident bytes if they can be read back.
    pub fn drop_resident(&self) {
        if self.cold.get().is_some() {
            lock(&self.resident).take();
        }
    }

    /// Reads the bytes back into memory (an own copy, not a slice of a read
    /// window), for an event that must outlive its segment.
    pub fn make_resident(&self) -> Result<(), ReadError> {
        if self.is_resident() {
            return Ok(());
        }
        let b = Bytes::copy_from_slice(&self.get()?);
        *lock(&self.resident) = Some(b);
        Ok(())
    }
}
