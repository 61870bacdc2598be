//! Which paths name the same file: a run refuses, before it reads or writes anything, an output
//! that is one of its inputs (a source, the script) or another of its outputs. Paths are
//! compared as files, not as strings: `./g.csv`, `data/../g.csv`, a symbolic link to it and a
//! hard link all name `g.csv`.

use std::path::{Path, PathBuf};

use crate::error::{Result, TesseraError};

/// What a path names: an existing file (by device and inode on Unix, by canonical path
/// elsewhere), or a file not created yet (by its canonical folder and its name). `None`:
/// something no run can clobber by writing to it (a device such as `/dev/null`, a pipe), or a
/// path whose folder does not exist (creating it then fails on its own).
fn identity(path: &Path) -> Option<Identity> {
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => None,
        Ok(meta) => Some(Identity::existing(path, &meta)),
        Err(_) => {
            let name = path.file_name()?;
            let folder = match path.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => parent.canonicalize().ok()?,
                _ => std::env::current_dir().ok()?,
            };
            Some(Identity::New(folder.join(name)))
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Identity {
    #[cfg(unix)]
    Existing {
        device: u64,
        inode: u64,
    },
    #[cfg(not(unix))]
    Existing(PathBuf),
    New(PathBuf),
}

impl Identity {
    #[cfg(unix)]
    fn existing(_path: &Path, meta: &std::fs::Metadata) -> Identity {
        use std::os::unix::fs::MetadataExt;
        Identity::Existing { device: meta.dev(), inode: meta.ino() }
    }

    #[cfg(not(unix))]
    fn existing(path: &Path, _meta: &std::fs::Metadata) -> Identity {
        Identity::Existing(path.canonicalize().unwrap_or_else(|_| path.to_path_buf()))
    }
}

/// A file a run reads or writes, with what it is to the run (`the script`, `source
/// \`readings\``, `--output`), for messages.
pub struct FileUse {
    pub role: String,
    pub path: PathBuf,
}

impl FileUse {
    pub fn new(role: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        FileUse { role: role.into(), path: path.into() }
    }
}

/// Refuses `outputs` if one of them is one of `inputs` or another output, naming both uses.
pub fn refuse_clobbering(inputs: &[FileUse], outputs: &[FileUse]) -> Result<()> {
    let inputs: Vec<(&FileUse, Identity)> = inputs.iter().filter_map(|u| Some((u, identity(&u.path)?))).collect();
    let mut seen: Vec<(&FileUse, Identity)> = Vec::new();
    for output in outputs {
        // Refused before a run, not after its results are written.
        let folder = output.path.parent().filter(|p| !p.as_os_str().is_empty());
        if folder.is_some_and(|folder| !folder.is_dir()) {
            return Err(TesseraError::Option(format!(
                "{} {}: its folder does not exist",
                output.role,
                output.path.display()
            )));
        }
        let Some(id) = identity(&output.path) else { continue };
        if let Some((input, _)) = inputs.iter().find(|(_, other)| *other == id) {
            return Err(TesseraError::Option(format!(
                "{} {} is {} ({}): writing there would destroy it; give another path",
                output.role,
                output.path.display(),
                input.role,
                input.path.display()
            )));
        }
        if let Some((other, _)) = seen.iter().find(|(_, other)| *other == id) {
            return Err(TesseraError::Option(format!(
                "{} {} is also {} ({}): two outputs cannot share a file; give another path",
                output.role,
                output.path.display(),
                other.role,
                other.path.display()
            )));
        }
        seen.push((output, id));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_naming_one_file_are_refused_however_spelled() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("g.csv");
        std::fs::write(&input, "a\n1\n").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let inputs = [FileUse::new("source `g`", &input)];
        let refused = |path: PathBuf| refuse_clobbering(&inputs, &[FileUse::new("--output", path)]);
        assert!(refused(dir.path().join("sub/../g.csv")).unwrap_err().to_string().contains("source `g`"));
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(&input, dir.path().join("link.csv")).unwrap();
            assert!(refused(dir.path().join("link.csv")).is_err(), "a symbolic link");
            std::fs::hard_link(&input, dir.path().join("hard.csv")).unwrap();
            assert!(refused(dir.path().join("hard.csv")).is_err(), "a hard link");
        }
        assert!(refused(dir.path().join("out.csv")).is_ok());
        // Two outputs on one file not created yet.
        let outputs = [
            FileUse::new("--output", dir.path().join("o.csv")),
            FileUse::new("--late-output", dir.path().join("sub/../o.csv")),
        ];
        let err = refuse_clobbering(&inputs, &outputs).unwrap_err().to_string();
        assert!(err.contains("--late-output") && err.contains("--output"), "{err}");
        // Devices are shared freely.
        let null = [FileUse::new("--output", "/dev/null"), FileUse::new("--late-output", "/dev/null")];
        assert!(refuse_clobbering(&inputs, &null).is_ok());
    }
}
