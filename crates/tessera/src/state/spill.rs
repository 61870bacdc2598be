//! Spilled state on local disk: an LSM tree (fjall, with bloom filters) holding the key groups
//! window operators evict from memory under `--state-memory`. It lives in a temporary folder
//! for the run, made when the first group is written (opening and closing an LSM tree costs
//! a quarter of a second, which runs whose state fits in memory need not pay); checkpoints
//! carry the spilled groups themselves, so nothing here must survive a crash.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{Result, TesseraError};

pub struct SpillStore {
    folder: PathBuf,
    /// The tree once opened (the workers of a run share the store).
    tree: Mutex<Option<(fjall::Keyspace, fjall::PartitionHandle)>>,
}

fn store_error(e: fjall::Error) -> TesseraError {
    TesseraError::Execution(format!("the spill store failed: {e}"))
}

impl SpillStore {
    /// A store in a new folder under `parent` (which is created now), removed when the store
    /// is dropped.
    pub fn open(parent: &Path) -> Result<Self> {
        std::fs::create_dir_all(parent)
            .map_err(|e| TesseraError::io(format!("cannot create {}", parent.display()), e))?;
        let unique = format!(
            "tessera-spill-{}-{}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
        );
        Ok(SpillStore { folder: parent.join(unique), tree: Mutex::new(None) })
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
