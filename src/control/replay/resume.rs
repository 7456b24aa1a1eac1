//! A replay's state file: where an interrupted replay continues with `--resume`.
//!
//! One JSON file per replay, named by a hash of its selecting arguments (the same arguments
//! find the same file), in `--state DIR` (default: the config file's directory). It holds the
//! resolved selecting condition and the position of the last row of the *acknowledged prefix*:
//! every row up to it, in replay order, was acknowledged by the broker (or skipped by the
//! filter). Rows after it may or may not have been delivered; a resumed replay sends them
//! again (consumers deduplicate on the id header), never skips one.
//!
//! Written with write-then-rename, so a kill at any moment leaves the old or the new state,
//! never a torn one; removed when the replay completes.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where the replay stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ReplayState {
    /// The selecting arguments this state belongs to ([`super::selection::Criteria::canonical`]).
    pub(crate) arguments: String,
    /// The SQL condition resolved at the first start, reused verbatim.
    pub(crate) condition: String,
    /// Rows acknowledged so far, over every run of this replay.
    pub(crate) acknowledged: u64,
    /// The last acknowledged row: its table (index into the replayed tables) and its ordering
    /// key's text (timestamp then id, or id alone). `None`: nothing acknowledged yet.
    pub(crate) position: Option<Position>,
}

/// A row's place in replay order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Position {
    pub(crate) table: usize,
    pub(crate) key: Vec<String>,
}

/// The state file of one replay.
#[derive(Debug, Clone)]
pub(crate) struct StateFile {
    path: PathBuf,
}

impl StateFile {
    /// The file for the replay with these canonical `arguments` in `dir`.
    pub(crate) fn new(dir: &Path, arguments: &str) -> StateFile {
        StateFile {
            path: dir.join(format!("outbox-relay-replay-{:016x}.json", fnv1a(arguments.as_bytes()))),
        }
    }

    /// The replay's id: the arguments' hash, as in the file name.
    pub(crate) fn id(&self) -> String {
        self.path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.strip_prefix("outbox-relay-replay-"))
            .unwrap_or_default()
            .to_owned()
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The saved state, if any.
    pub(crate) fn load(&self) -> Result<Option<ReplayState>, String> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read the replay state {}: {e}", self.path.display())),
        };
        serde_json::from_str(&text).map(Some).map_err(|e| {
            format!(
                "the replay state {} is not readable ({e}); delete it to start the replay over",
                self.path.display()
            )
        })
    }

    /// Replaces the saved state (atomically).
    pub(crate) fn save(&self, state: &ReplayState) -> Result<(), String> {
        let tmp = self.path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(state).map_err(|e| e.to_string())?;
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &self.path))
            .map_err(|e| {
                format!(
                    "cannot write the replay state {} ({e}); give a writable directory with --state DIR",
                    self.path.display()
                )
            })
    }

    /// The replay completed: nothing to resume.
    pub(crate) fn remove(&self) -> Result<(), String> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("cannot remove the replay state {}: {e}", self.path.display())),
        }
    }
}

/// FNV-1a, 64 bits: stable across builds and platforms (std's hasher is not), which a file
/// name found again by a later run needs.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_arguments_find_the_same_file_and_a_save_round_trips() {
        let dir = std::env::temp_dir().join(format!("replay-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = StateFile::new(&dir, "since=1h");
        assert_eq!(file.path(), StateFile::new(&dir, "since=1h").path());
        assert_ne!(file.path(), StateFile::new(&dir, "since=2h").path());
        assert_eq!(file.load(), Ok(None));
        let state = ReplayState {
            arguments: "since=1h".into(),
            condition: "true".into(),
            acknowledged: 3,
            position: Some(Position {
                table: 0,
                key: vec!["41".into()],
            }),
        };
        file.save(&state).unwrap();
        assert_eq!(file.load(), Ok(Some(state)));
        file.remove().unwrap();
        assert_eq!(file.load(), Ok(None));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_hash_is_fnv1a() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
