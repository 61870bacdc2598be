//! Spilled state on local disk: an LSM tree (fjall, with bloom filters) holding the key groups
//! window operators evict from memory under `--state-memory`. It lives in a temporary folder
//! for the run, made when the first group is written (opening and closing an LSM tree costs
//! a quarter of a second, which runs whose state fits in memory need not pay); checkpoints
//! carry the spilled groups themselves, so nothing here must survive a crash. A run holds a
//! lock on a file beside its folder; a killed run's lock is released with it, and the next
//! store opened under the same parent removes the folders whose lock nobody holds.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{Result, TesseraError};

pub struct SpillStore {
    folder: PathBuf,
    /// The tree once opened (the workers of a run share the store).
    tree: Mutex<Option<(fjall::Keyspace, fjall::PartitionHandle)>>,
    /// The file beside the folder (`<folder>.lock`), locked while the store is open, which
    /// tells other runs the folder is in use.
    lock: (PathBuf, std::fs::File),
}

/// The start of a spill folder's name.
const PREFIX: &str = "tessera-spill-";

/// The lock file of a spill folder.
fn lock_path(folder: &Path) -> PathBuf {
    let mut name = folder.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// Removes the spill folders under `parent` that runs killed before they could remove them
/// left behind: those whose lock file nobody holds.
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
    TesseraError::Execution(format!("the spill store failed: {e}"))
}

impl SpillStore {
    /// A store in a new folder under `parent` (which is created now), removed when the store
    /// is dropped; first removes the folders killed runs left there.
    pub fn open(parent: &Path) -> Result<Self> {
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
        Ok(SpillStore { folder, tree: Mutex::new(None), lock: (lock, file) })
    }

    /// The groups' partition, if the tree is open (opening it when `create`).
    fn groups(&self, create: bool) -> Result<Option<fjall::PartitionHandle>> {
        let mut tree = self.tree.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if tree.is_none() && create {
            let keyspace = fjall::Config::new(&self.folder).temporary(true).open().map_err(store_error)?;
            let groups = keyspace.open_partition("groups", Default::default()).map_err(store_error)?;
            *tree = Some((keyspace, groups));
        }
        Ok(tree.as_ref().map(|(_, groups)| groups.clone()))
    }

    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let groups = self.groups(true)?.expect("opened");
        groups.insert(key, value).map_err(store_error)
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.groups(false)? {
            Some(groups) => Ok(groups.get(key).map_err(store_error)?.map(|v| v.to_vec())),
            None => Ok(None),
        }
    }

    pub fn remove(&self, key: &[u8]) -> Result<()> {
        match self.groups(false)? {
            Some(groups) => groups.remove(key).map_err(store_error),
            None => Ok(()),
        }
    }
}

impl Drop for SpillStore {
    /// Removes the folder (the tree is temporary), then its lock file (unlocked as it closes).
    fn drop(&mut self) {
        drop(self.tree.get_mut().map(Option::take));
        let _ = std::fs::remove_file(&self.lock.0);
    }
}
