//! Spilled state on local disk: an LSM tree (fjall, with bloom filters) holding the key groups
//! window operators evict from memory under `--state-memory`. It lives in a temporary folder
//! for the run; checkpoints carry the spilled groups themselves, so nothing here must survive
//! a crash.

use std::path::Path;

use crate::error::{Result, TesseraError};

pub struct SpillStore {
    _keyspace: fjall::Keyspace,
    groups: fjall::PartitionHandle,
}

fn store_error(e: fjall::Error) -> TesseraError {
    TesseraError::Execution(format!("the spill store failed: {e}"))
}

impl SpillStore {
    /// A store in a new folder under `parent`, removed when the store is dropped.
    pub fn open(parent: &Path) -> Result<Self> {
        std::fs::create_dir_all(parent)
            .map_err(|e| TesseraError::io(format!("cannot create {}", parent.display()), e))?;
        let unique = format!(
            "tessera-spill-{}-{}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
        );
        let keyspace = fjall::Config::new(parent.join(unique)).temporary(true).open().map_err(store_error)?;
        let groups = keyspace.open_partition("groups", Default::default()).map_err(store_error)?;
        Ok(SpillStore { _keyspace: keyspace, groups })
    }

    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.groups.insert(key, value).map_err(store_error)
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.groups.get(key).map_err(store_error)?.map(|v| v.to_vec()))
    }

    pub fn remove(&self, key: &[u8]) -> Result<()> {
        self.groups.remove(key).map_err(store_error)
    }
}
