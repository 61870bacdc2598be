//! The state store: an LSM tree (fjall, with bloom filters) holding the state tables that
//! window operators save beyond memory and at checkpoints (see [`crate::exec`]'s key groups).
//!
//! A run with a state directory keeps a *durable* store in it (`<state-dir>/store`), which a
//! checkpoint makes durable ([`persist`](StateStore::persist)) before its manifest names the
//! table versions it needs; a resumed run opens it again. A run without one keeps a
//! *temporary* store in a folder made when the first table is written (opening and closing an
//! LSM tree costs a quarter of a second, which runs whose state fits in memory need not pay)
//! and removed with the store. A temporary store's folder holds a lock on a file beside it; a
//! killed run's lock is released with it, and the next temporary store made under the same
//! parent removes the folders whose lock nobody holds.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{Result, TesseraError};

pub struct StateStore {
    folder: PathBuf,
    parent: PathBuf,
    durable: bool,
    /// The tree once opened (the workers of a run share the store).
    tree: Mutex<Option<(fjall::Keyspace, fjall::PartitionHandle)>>,
    /// A temporary store's lock file (`<folder>.lock`), locked while the store is open,
    /// which tells other runs the folder is in use.
    lock: Mutex<Option<(PathBuf, std::fs::File)>>,
}

/// The LSM tree's block cache, write buffers (memtables not yet flushed) and memtable.
const CACHE_BYTES: u64 = 4 << 20;
const WRITE_BUFFER_BYTES: u64 = 8 << 20;
const MEMTABLE_BYTES: u32 = 4 << 20;

/// The start of a temporary store's folder name.
const PREFIX: &str = "tessera-spill-";

/// The lock file of a temporary store's folder.
fn lock_path(folder: &Path) -> PathBuf {
    let mut name = folder.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// Removes the temporary folders under `parent` that runs killed before they could remove
/// them left behind: those whose lock file nobody holds.
fn remove_abandoned(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(folder) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)?.strip_suffix(".lock")) else {
            continue;
        };
        let lock = entry.path();
        let abandoned = std::fs::File::open(&lock).is_ok_and(|file| file.try_lock().is_ok());
        if abandoned {
            let _ = std::fs::remove_dir_all(parent.join(format!("{PREFIX}{folder}")));
            let _ = std::fs::remove_file(&lock);
        }
    }
}

fn store_error(e: fjall::Error) -> TesseraError {
    TesseraError::Execution(format!("the state store failed: {e}"))
}

impl StateStore {
    /// A temporary store in a new folder under `parent`, made (with `parent`) when the first
    /// table is written and removed when the store is dropped.
    pub fn temporary(parent: &Path) -> Self {
        StateStore {
            folder: PathBuf::new(),
            parent: parent.to_path_buf(),
            durable: false,
            tree: Mutex::new(None),
            lock: Mutex::new(None),
        }
    }

    /// The durable store in `folder`, opened (created if absent) now.
    pub fn durable(folder: &Path) -> Result<Self> {
        let store = StateStore {
            folder: folder.to_path_buf(),
            parent: PathBuf::new(),
            durable: true,
            tree: Mutex::new(None),
            lock: Mutex::new(None),
        };
        store.tables(true)?;
        Ok(store)
    }

    pub fn is_durable(&self) -> bool {
        self.durable
    }

    /// Makes a temporary store's folder and its lock, first removing abandoned ones.
    fn make_temporary_folder(&self) -> Result<PathBuf> {
        let parent = &self.parent;
        std::fs::create_dir_all(parent)
            .map_err(|e| TesseraError::io(format!("cannot create {}", parent.display()), e))?;
        remove_abandoned(parent);
        let unique = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
        );
        let folder = parent.join(unique);
        let lock = lock_path(&folder);
        let cannot = |e| TesseraError::io(format!("cannot create {}", lock.display()), e);
        let file = std::fs::File::create(&lock).map_err(cannot)?;
        file.lock().map_err(cannot)?;
        *self.lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some((lock, file));
        Ok(folder)
    }

    /// The tables' partition, if the tree is open (opening it when `create`).
    fn tables(&self, create: bool) -> Result<Option<fjall::PartitionHandle>> {
        let mut tree = self.tree.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if tree.is_none() && create {
            let config = if self.durable {
                fjall::Config::new(&self.folder)
            } else {
                fjall::Config::new(self.make_temporary_folder()?).temporary(true)
            };
            // Tables are read back once, when their key group is loaded: a block cache would
            // not be hit, and write buffers count against the memory the state may take.
            let config = config.cache_size(CACHE_BYTES).max_write_buffer_size(WRITE_BUFFER_BYTES);
            let keyspace = config.open().map_err(store_error)?;
            let options = fjall::PartitionCreateOptions::default().max_memtable_size(MEMTABLE_BYTES);
            let tables = keyspace.open_partition("tables", options).map_err(store_error)?;
            *tree = Some((keyspace, tables));
        }
        Ok(tree.as_ref().map(|(_, tables)| tables.clone()))
    }

    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let tables = self.tables(true)?.expect("opened");
        tables.insert(key, value).map_err(store_error)
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.tables(false)? {
            Some(tables) => Ok(tables.get(key).map_err(store_error)?.map(|v| v.to_vec())),
            None => Ok(None),
        }
    }

    pub fn remove(&self, key: &[u8]) -> Result<()> {
        match self.tables(false)? {
            Some(tables) => tables.remove(key).map_err(store_error),
            None => Ok(()),
        }
    }

    /// Every key starting with `prefix`, in order.
    pub fn keys(&self, prefix: &[u8]) -> Result<Vec<Vec<u8>>> {
        let Some(tables) = self.tables(false)? else { return Ok(Vec::new()) };
        tables.prefix(prefix).map(|kv| kv.map(|(k, _)| k.to_vec()).map_err(store_error)).collect()
    }

    /// Makes every write so far survive a crash (a durable store's checkpoint).
    pub fn persist(&self) -> Result<()> {
        let tree = self.tree.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match tree.as_ref() {
            Some((keyspace, _)) => keyspace.persist(fjall::PersistMode::SyncAll).map_err(store_error),
            None => Ok(()),
        }
    }
}

impl Drop for StateStore {
    /// Closes the tree; a temporary store's folder goes with it, then its lock file.
    fn drop(&mut self) {
        drop(self.tree.get_mut().map(Option::take));
        if let Ok(Some((lock, _))) = self.lock.get_mut().map(Option::take) {
            let _ = std::fs::remove_file(lock);
        }
    }
}
