//! Versions of one operator's saved tables in the state store, by checkpoint epoch.
//!
//! A table (a name the operator chooses: a key group's slice, a group of synopsis partitions)
//! is written under `operator id ++ name ++ epoch`, the epoch being the one the next
//! checkpoint commits. Saving a table again in a later epoch writes a new version; the one it
//! replaces may still be named by the last committed checkpoint, so it is deleted only once
//! the next checkpoint has started (that one commits the newer version), or at once if no
//! checkpoint can name it (written in the current epoch). A resumed run deletes every version
//! its checkpoint does not name: those written after it and those it had already retired.
//! Evictions beyond memory and checkpoints write through the same versions, so a checkpoint
//! writes only the tables that changed since they were last written.

use std::sync::Arc;

use crate::error::{Result, TesseraError};
use crate::state::store::StateStore;

pub(super) struct Versions {
    store: Arc<StateStore>,
    /// Distinguishes this operator's tables in the store.
    operator: u64,
    /// Tables saved now get this version; the next checkpoint commits it.
    epoch: u64,
    /// Keys of versions replaced in the epoch (second), which the checkpoint of that epoch
    /// does not need but the previous one may: deleted once a later checkpoint starts.
    retired: Vec<(Vec<u8>, u64)>,
    /// Bytes of tables written since the last checkpoint (evictions and the checkpoint).
    written_since_checkpoint: u64,
}

impl Versions {
    pub(super) fn new(store: Arc<StateStore>, operator: u64) -> Self {
        Versions { store, operator, epoch: 0, retired: Vec::new(), written_since_checkpoint: 0 }
    }

    pub(super) fn epoch(&self) -> u64 {
        self.epoch
    }

    fn key(&self, name: &[u8], epoch: u64) -> Vec<u8> {
        let mut key = Vec::with_capacity(16 + name.len());
        key.extend_from_slice(&self.operator.to_be_bytes());
        key.extend_from_slice(name);
        key.extend_from_slice(&epoch.to_be_bytes());
        key
    }

    /// Writes a new version of table `name` (replacing version `previous`); returns the
    /// version written.
    pub(super) fn put(&mut self, name: &[u8], bytes: &[u8], previous: Option<u64>) -> Result<u64> {
        if let Some(previous) = previous.filter(|&p| p != self.epoch) {
            self.retire(name, previous)?;
        }
        self.store.put(&self.key(name, self.epoch), bytes)?;
        self.written_since_checkpoint += bytes.len() as u64;
        Ok(self.epoch)
    }

    /// A version no longer needed once the current epoch's checkpoint commits: deleted now if
    /// it was written in this epoch (no checkpoint names it), later otherwise.
    pub(super) fn retire(&mut self, name: &[u8], epoch: u64) -> Result<()> {
        let key = self.key(name, epoch);
        if epoch == self.epoch {
            self.store.remove(&key)
        } else {
            self.retired.push((key, self.epoch));
            Ok(())
        }
    }

    /// Version `epoch` of table `name`, which must be in the store.
    pub(super) fn get(&self, name: &[u8], epoch: u64, what: &dyn Fn() -> String) -> Result<Vec<u8>> {
        self.store
            .get(&self.key(name, epoch))?
            .ok_or_else(|| TesseraError::Checkpoint(format!("{} is missing from the state store", what())))
    }

    /// Starts a checkpoint: deletes the versions retired before its epoch (the previous
    /// checkpoint, which committed their replacements, is done).
    pub(super) fn begin_checkpoint(&mut self) -> Result<()> {
        let epoch = self.epoch;
        for (key, _) in self.retired.extract_if(.., |(_, retired_in)| *retired_in < epoch) {
            self.store.remove(&key)?;
        }
        Ok(())
    }

    /// Ends a checkpoint (its snapshot names the versions written so far); returns the bytes
    /// written since the previous one.
    pub(super) fn end_checkpoint(&mut self) -> u64 {
        self.epoch += 1;
        std::mem::take(&mut self.written_since_checkpoint)
    }

    /// Resumes after the checkpoint of `epoch`: deletes every version of the operator's
    /// tables that `named` (given a table's name and version) says the checkpoint does not
    /// name.
    pub(super) fn restore(&mut self, epoch: u64, named: &mut dyn FnMut(&[u8], u64) -> Result<bool>) -> Result<()> {
        self.epoch = epoch + 1;
        self.retired.clear();
        let corrupt = || TesseraError::Checkpoint("the state store holds a key tessera did not write".into());
        for key in self.store.keys(&self.operator.to_be_bytes())? {
            let name = key.get(8..key.len().saturating_sub(8)).filter(|_| key.len() >= 16).ok_or_else(corrupt)?;
            let version = u64::from_be_bytes(key[key.len() - 8..].try_into().expect("8 bytes"));
            if !named(name, version)? {
                self.store.remove(&key)?;
            }
        }
        Ok(())
    }
}
