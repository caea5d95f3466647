//! A recording file system for the power-cut tests: it knows what was
//! written and what was made durable — a file's data by its `fdatasync`, a
//! directory's creates, renames and unlinks by the directory's `fsync` —
//! and a [`SimFs::crash`] keeps only the durable state, plus optionally a
//! random subset of the unsynced pages (as a disk may have written some of
//! them before the power went). It can also be told to fail every call
//! after a number of them (the process dies there; a write cut by it keeps
//! a random prefix).

use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
};

use crate::store::fileops::{DirError, FileOps};

/// The unit the crash model keeps or drops: smaller than a real page (a
/// sector is 512 bytes), so that the small batches of the tests tear
/// across it.
pub const PAGE: usize = 128;

#[derive(Debug, Clone, Default)]
struct Inode {
    data: Vec<u8>,
    durable: Vec<u8>,
}

#[derive(Debug, Default)]
struct State {
    inodes: Vec<Inode>,
    live: BTreeMap<PathBuf, usize>,
    durable_dir: BTreeMap<PathBuf, usize>,
    /// Calls left before the power goes (`None`: never).
    calls_left: Option<u64>,
    dead: bool,
    rng: u64,
}

impl State {
    fn next(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.rng.max(1);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// One call: fails once the power is gone.
    fn tick(&mut self) -> io::Result<()> {
        if self.dead {
            return Err(io::Error::other("power cut"));
        }
        if let Some(n) = self.calls_left.as_mut() {
            if *n == 0 {
                self.dead = true;
                return Err(io::Error::other("power cut"));
            }
            *n -= 1;
        }
        Ok(())
    }

    fn lookup(&self, path: &Path) -> io::Result<usize> {
        self.live
            .get(path)
            .copied()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }
}

/// A shared handle: the store owns one, the test keeps another.
#[derive(Debug, Clone, Default)]
pub struct SimFs {
    state: Arc<Mutex<State>>,
}

impl SimFs {
    pub fn new(seed: u64) -> SimFs {
        let fs = SimFs::default();
        fs.lock().rng = seed | 1;
        fs
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The power goes after `n` more calls.
    pub fn fail_after(&self, n: u64) {
        self.lock().calls_left = Some(n);
    }

    pub fn is_dead(&self) -> bool {
        self.lock().dead
    }

    /// The machine after a power cut: the durable directory and durable
    /// file contents; with `keep_pages`, each unsynced page of a file may
    /// have reached the disk (or the file may have been extended with zeros
    /// that never got their data).
    pub fn crash(&self, keep_pages: bool) -> SimFs {
        let mut st = self.lock();
        let mut inodes = vec![];
        let mut map = BTreeMap::new();
        let mut new_id = BTreeMap::new();
        let entries: Vec<(PathBuf, usize)> = st
            .durable_dir
            .iter()
            .map(|(p, &i)| (p.clone(), i))
            .collect();
        for (path, id) in entries {
            let nid = *new_id.entry(id).or_insert_with(|| {
                inodes.push(Inode::default());
                inodes.len() - 1
            });
            map.insert(path, nid);
            let old = st.inodes[id].clone();
            let data = if keep_pages && old.data != old.durable {
                let (lo, hi) = (
                    old.durable.len().min(old.data.len()),
                    old.durable.len().max(old.data.len()),
                );
                let len = lo + (st.next() as usize) % (hi - lo + 1);
                let mut out = vec![0u8; len];
                for (p, chunk) in out.chunks_mut(PAGE).enumerate() {
                    let at = p * PAGE;
                    let from = if st.next().is_multiple_of(2) {
                        &old.data
                    } else {
                        &old.durable
                    };
                    for (i, b) in chunk.iter_mut().enumerate() {
                        *b = from.get(at + i).copied().unwrap_or(0);
                    }
                }
                out
            } else {
                old.durable.clone()
            };
            inodes[nid] = Inode {
                durable: data.clone(),
                data,
            };
        }
        let rng = st.next();
        SimFs {
            state: Arc::new(Mutex::new(State {
                inodes,
                live: map.clone(),
                durable_dir: map,
                calls_left: None,
                dead: false,
                rng,
            })),
        }
    }

    /// The machine after `kill -9` of the process: the page cache keeps
    /// everything written, durable or not; a later [`SimFs::crash`] may
    /// still drop what nobody synced.
    pub fn kill(&self) -> SimFs {
        let mut st = self.lock();
        st.dead = false;
        st.calls_left = None;
        drop(st);
        self.clone()
    }

    /// Test access: the live file names and bytes.
    pub fn files(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let st = self.lock();
        st.live
            .iter()
            .map(|(p, &i)| (p.clone(), st.inodes[i].data.clone()))
            .collect()
    }

    /// Test access: replaces (or with `None` removes) a file, durably.
    pub fn put(&self, path: &Path, bytes: Option<Vec<u8>>) {
        let mut st = self.lock();
        match bytes {
            Some(b) => {
                st.inodes.push(Inode {
                    data: b.clone(),
                    durable: b,
                });
                let id = st.inodes.len() - 1;
                st.live.insert(path.to_owned(), id);
            }
            None => {
                st.live.remove(path);
            }
        }
        st.durable_dir = st.live.clone();
    }
}

impl FileOps for SimFs {
    type File = usize;

    fn prepare_dir(&self, _dir: &Path) -> Result<(), DirError> {
        Ok(())
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut st = self.lock();
        st.tick()?;
        let id = st.lookup(path)?;
        Ok(st.inodes[id].data.clone())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut st = self.lock();
        st.tick()?;
        Ok(st
            .live
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| Some(p.file_name()?.to_str()?.to_owned()))
            .collect())
    }

    fn create_new(&self, path: &Path) -> io::Result<usize> {
        let mut st = self.lock();
        st.tick()?;
        if st.live.contains_key(path) {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        st.inodes.push(Inode::default());
        let id = st.inodes.len() - 1;
        st.live.insert(path.to_owned(), id);
        Ok(id)
    }

    fn open_append(&self, path: &Path) -> io::Result<usize> {
        let mut st = self.lock();
        st.tick()?;
        st.lookup(path)
    }

    fn write(&self, file: &mut usize, bytes: &[u8]) -> io::Result<()> {
        let mut st = self.lock();
        let was_dead = st.dead;
        if let Err(e) = st.tick() {
            if !was_dead && !bytes.is_empty() {
                // Cut mid-write: a prefix made it to the page cache.
                let n = (st.next() as usize) % bytes.len();
                st.inodes[*file].data.extend_from_slice(&bytes[..n]);
            }
            return Err(e);
        }
        st.inodes[*file].data.extend_from_slice(bytes);
        Ok(())
    }

    fn sync_data(&self, file: &mut usize) -> io::Result<()> {
        let mut st = self.lock();
        st.tick()?;
        let inode = &mut st.inodes[*file];
        inode.durable = inode.data.clone();
        Ok(())
    }

    fn set_len(&self, file: &mut usize, len: u64) -> io::Result<()> {
        let mut st = self.lock();
        st.tick()?;
        st.inodes[*file].data.resize(len as usize, 0);
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.tick()?;
        let id = st.lookup(from)?;
        st.live.remove(from);
        st.live.insert(to.to_owned(), id);
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.tick()?;
        st.lookup(path)?;
        st.live.remove(path);
        Ok(())
    }

    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.tick()?;
        st.durable_dir = st.live.clone();
        Ok(())
    }
}
