//! An event's encoded bytes as the log holds them: in memory with the
//! caches of a hot event while it is in the log's hot tail, then either
//! resident alone (a store that keeps no files) or read back on each use
//! from its record in a disk store segment (a cold place: the segment,
//! shared by every event in it, and an offset).
//!
//! A read of a cold body can fail (an I/O error, a record that no longer
//! checks out): that is a store failure, told to the store's reader
//! ([`ColdSource::failed`]), which the committer asks through its store
//! (`Store::take_read_failure`) so that the bus stops with the
//! store-failed contract, as when an append fails.

use std::{
    fmt,
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard},
};

use bytes::Bytes;

use super::LineParts;

/// Reads event bodies back from a store's files.
pub trait ColdSource: Send + Sync + fmt::Debug {
    /// The last `len` bytes of the payload of the record at offset `at` of
    /// `segment`, checked against the record's checksum.
    fn read(&self, segment: &Arc<PathBuf>, at: u64, len: usize) -> std::io::Result<Bytes>;

    /// A read failed (`why`): the store failed. Kept until its store is
    /// asked (`Store::take_read_failure`); the first one wins.
    fn failed(&self, why: &str);

    /// The failure kept since the last call, if any.
    fn take_failure(&self) -> Option<String>;
}

/// A segment and its reader, shared by every cold event in it (the store
/// makes one per segment).
#[derive(Debug)]
pub struct ColdSegment {
    pub source: Arc<dyn ColdSource>,
    pub path: Arc<PathBuf>,
}

/// A cold event's place: 16 bytes per event. What a store hands the log
/// once an event's record is durable.
#[derive(Debug, Clone)]
pub struct Place {
    pub segment: Arc<ColdSegment>,
    /// Byte offset of the record (its header) in the segment; the reader
    /// takes the payload's length from the record's header.
    pub at: u64,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn failed(p: &Place, e: std::io::Error) -> ReadError {
    let why = format!(
        "cannot read an event back from {} (offset {}): {e}",
        p.segment.path.display(),
        p.at
    );
    p.segment.source.failed(&why);
    ReadError(why)
}

/// A hot event's bytes and what is rendered from them once.
#[derive(Debug, Default)]
struct Hot {
    bytes: Bytes,
    cold: Option<Place>,
    line_parts: Option<Arc<LineParts>>,
}

#[derive(Debug, Default)]
enum State {
    #[default]
    Empty,
    /// In the hot tail.
    Hot(Box<Hot>),
    /// Out of the hot tail, no file to read it back from.
    Resident(Box<Bytes>),
    /// Out of the hot tail, on disk only.
    Cold(Place),
}

/// An event's encoded `v1::Event`: hot, resident, or on disk once cooled.
#[derive(Debug, Default)]
pub struct Body {
    len: u32,
    state: Mutex<State>,
}

impl From<Bytes> for Body {
    fn from(b: Bytes) -> Body {
        Body {
            len: b.len() as u32,
            state: Mutex::new(State::Hot(Box::new(Hot {
                bytes: b,
                ..Hot::default()
            }))),
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
    pub fn cold(len: usize, place: Place) -> Body {
        Body {
            len: len as u32,
            state: Mutex::new(State::Cold(place)),
        }
    }

    /// Bytes of the encoded event, resident or not.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the bytes are on disk, when only there.
    pub fn place(&self) -> Option<Place> {
        match &*lock(&self.state) {
            State::Cold(p) => Some(p.clone()),
            _ => None,
        }
    }

    /// The bytes: resident, else read from the store.
    pub fn get(&self) -> Result<Bytes, ReadError> {
        let place = match &*lock(&self.state) {
            State::Empty => return Ok(Bytes::new()),
            State::Hot(h) => return Ok(h.bytes.clone()),
            State::Resident(b) => return Ok((**b).clone()),
            State::Cold(p) => p.clone(),
        };
        place
            .segment
            .source
            .read(&place.segment.path, place.at, self.len())
            .map_err(|e| failed(&place, e))
    }

    /// Where the bytes are on disk (set by the store once they are durable).
    pub fn set_cold(&self, place: Place) {
        let mut s = lock(&self.state);
        match &mut *s {
            State::Hot(h) => h.cold = Some(place),
            State::Resident(_) | State::Empty => *s = State::Cold(place),
            State::Cold(_) => {}
        }
    }

    /// In memory (hot or resident).
    pub fn is_resident(&self) -> bool {
        matches!(&*lock(&self.state), State::Hot(_) | State::Resident(_))
    }

    /// Out of the hot tail: nothing is cached for it.
    pub fn is_cooled(&self) -> bool {
        !matches!(&*lock(&self.state), State::Hot(_))
    }

    /// Leaves the hot tail: the caches go, and the bytes too when they can
    /// be read back.
    pub fn cool(&self) {
        let mut s = lock(&self.state);
        if !matches!(&*s, State::Hot(_)) {
            return;
        }
        if let State::Hot(h) = std::mem::take(&mut *s) {
            let Hot { bytes, cold, .. } = *h;
            *s = match cold {
                Some(p) => State::Cold(p),
                None => State::Resident(Box::new(bytes)),
            };
        }
    }

    /// Reads the bytes back into memory (an own copy, not a slice of a read
    /// window), for an event that must outlive its segment.
    pub fn make_resident(&self) -> Result<(), ReadError> {
        let place = match &*lock(&self.state) {
            State::Cold(p) => p.clone(),
            _ => return Ok(()),
        };
        let b = place
            .segment
            .source
            .read(&place.segment.path, place.at, self.len())
            .map_err(|e| failed(&place, e))?;
        let mut s = lock(&self.state);
        if let State::Cold(_) = &*s {
            *s = State::Resident(Box::new(Bytes::copy_from_slice(&b)));
        }
        Ok(())
    }

    /// The cached line parts, if any.
    pub fn peek_line_parts(&self) -> Option<Arc<LineParts>> {
        match &*lock(&self.state) {
            State::Hot(h) => h.line_parts.clone(),
            _ => None,
        }
    }

    /// Bytes of the cached line parts, if any, without cloning them.
    pub fn line_parts_len(&self) -> Option<usize> {
        match &*lock(&self.state) {
            State::Hot(h) => h.line_parts.as_ref().map(|p| p.len()),
            _ => None,
        }
    }

    /// The line parts: cached, or made from the bytes (and kept while hot).
    pub fn line_parts(
        &self,
        make: impl FnOnce(Bytes) -> Arc<LineParts>,
    ) -> Result<Arc<LineParts>, ReadError> {
        if let Some(hit) = self.peek_line_parts() {
            return Ok(hit);
        }
        let made = make(self.get()?);
        if let State::Hot(h) = &mut *lock(&self.state) {
            return Ok(h.line_parts.get_or_insert(made).clone());
        }
        Ok(made)
    }
}
