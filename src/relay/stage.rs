//! Step 2b, stage: the outbox changes of transactions the server streams before they commit
//! (pgoutput protocol 2, `postgres/replication/protocol.rs`), kept until their Stream Commit
//! releases them in commit order or their Stream Abort drops them.
//!
//! What is kept is the decode step's choice (`decode.rs`): the outbox inserts and outbox
//! messages of a streamed transaction and the outbox tables' Relation messages, each as the
//! pgoutput message it arrived as, without its xid. Changes live in memory up to
//! `relay.stage_memory_bytes` (all open transactions together); past it the largest transaction
//! in memory moves to a spill file of its own in `relay.stage_dir`/<slot>, and the rest of it
//! follows there. The spill files together may hold `relay.stage_disk_bytes`; a transaction
//! that needs more stops the session with [`StageError::Full`] — nothing is lost: the slot is
//! never confirmed past a transaction that is not published, so the server sends it again.
//!
//! A subtransaction's abort drops its changes (those still in memory at once, spilled ones when
//! the transaction is released); its Relation messages stay, because the server does not send
//! a table's Relation again within the same streamed transaction. Spill files are removed when
//! their transaction is released and read, or aborted, and every file left in the directory
//! (a killed process's) is removed when a session opens the stage: its transactions are
//! streamed again from their start.
//!
//! The stage runs on the stream's own thread (`relay::run`): its file I/O blocks that thread
//! and nothing else.
//!
//! Invariant: a released transaction yields its kept messages in the order they were pushed,
//! less those of aborted subtransactions.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::{BufReader, BufWriter, ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use tracing::{debug, info};

use super::error::StageError;
use crate::config::relay::StageSettings;

/// A kept message's subtransaction when no subtransaction abort may drop it (a Relation).
const KEPT_THROUGH_ABORTS: u32 = 0;
/// A spill file's name ends with this; anything else in the directory is left alone.
const SPILL_SUFFIX: &str = ".stage";
/// Bytes a message takes in a spill file besides itself: its subtransaction and its length.
const ENTRY_HEADER: usize = 8;

/// One kept message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The (sub)transaction it belongs to, or [`KEPT_THROUGH_ABORTS`].
    subxid: u32,
    message: Bytes,
}

impl Entry {
    /// A change of (sub)transaction `subxid`: dropped if that subtransaction aborts.
    pub(crate) fn change(subxid: u32, message: Bytes) -> Entry {
        Entry { subxid, message }
    }

    /// A table's shape: kept whatever subtransaction aborts.
    pub(crate) fn schema(message: Bytes) -> Entry {
        Entry {
            subxid: KEPT_THROUGH_ABORTS,
            message,
        }
    }

    /// The kept message (a reference-counted view, no copy).
    pub(crate) fn message(&self) -> Bytes {
        self.message.clone()
    }

    fn weight(&self) -> usize {
        self.message.len() + ENTRY_HEADER
    }
}

/// What the stage holds, for metrics and `status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StageUse {
    pub(crate) transactions: usize,
    pub(crate) memory_bytes: usize,
    pub(crate) disk_bytes: u64,
}

struct Spill {
    path: PathBuf,
    file: BufWriter<File>,
    bytes: u64,
}

#[derive(Default)]
struct Staged {
    memory: Vec<Entry>,
    memory_bytes: usize,
    spill: Option<Spill>,
    /// Subtransactions aborted while parts of them were spilled: skipped at release.
    aborted: HashSet<u32>,
}

/// The stage of one session (see the module docs).
pub(crate) struct Stage {
    dir: PathBuf,
    memory_bound: usize,
    disk_bound: u64,
    txns: HashMap<u32, Staged>,
    memory_bytes: usize,
    disk_bytes: u64,
}

impl Stage {
    /// Opens the stage of `slot`: creates its directory (owner only) and removes the spill files
    /// a killed process left there.
    ///
    /// # Errors
    ///
    /// [`StageError::Io`] when the directory cannot be created or cleaned.
    pub(crate) fn open(settings: &StageSettings, slot: &str) -> Result<Stage, StageError> {
        let dir = settings.dir.join(slot);
        let io = |what: &'static str, path: &Path| {
            let path = path.to_owned();
            move |source| StageError::Io { what, path, source }
        };
        let mut builder = fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(&dir).map_err(io("create the stage directory", &dir))?;
        let (mut removed, mut bytes) = (0usize, 0u64);
        for entry in fs::read_dir(&dir).map_err(io("list the stage directory", &dir))? {
            let entry = entry.map_err(io("list the stage directory", &dir))?;
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some(&SPILL_SUFFIX[1..]) {
                continue;
            }
            bytes += entry.metadata().map(|m| m.len()).unwrap_or(0);
            fs::remove_file(&path).map_err(io("remove a spill file left by an earlier process", &path))?;
            removed += 1;
        }
        if removed > 0 {
            info!(
                dir = %dir.display(),
                files = removed,
                bytes,
                "removed the spill files of streamed transactions an earlier process left; the server streams those \
                 transactions again"
            );
        }
        Ok(Stage {
            dir,
            memory_bound: settings.memory_bytes,
            disk_bound: settings.disk_bytes,
            txns: HashMap::new(),
            memory_bytes: 0,
            disk_bytes: 0,
        })
    }

    /// Keeps `entry` for the streamed transaction `xid`.
    ///
    /// # Errors
    ///
    /// [`StageError::Full`] past `relay.stage_disk_bytes`; [`StageError::Io`] when a spill file
    /// cannot be written.
    pub(crate) fn push(&mut self, xid: u32, entry: Entry) -> Result<(), StageError> {
        let staged = self.txns.entry(xid).or_default();
        if staged.spill.is_some() {
            return self.write_spilled(xid, &[entry]);
        }
        self.memory_bytes += entry.weight();
        staged.memory_bytes += entry.weight();
        staged.memory.push(entry);
        while self.memory_bytes > self.memory_bound {
            let Some(largest) = self
                .txns
                .iter()
                .filter(|(_, t)| t.memory_bytes > 0)
                .max_by_key(|(_, t)| t.memory_bytes)
                .map(|(xid, _)| *xid)
            else {
                break;
            };
            self.spill(largest)?;
        }
        Ok(())
    }

    /// Moves what `xid` keeps in memory to its spill file.
    fn spill(&mut self, xid: u32) -> Result<(), StageError> {
        let staged = self.txns.get_mut(&xid).ok_or(StageError::Protocol(xid))?;
        let entries = std::mem::take(&mut staged.memory);
        self.memory_bytes -= staged.memory_bytes;
        staged.memory_bytes = 0;
        debug!(
            xid,
            entries = entries.len(),
            "spilling a streamed transaction to the stage directory"
        );
        self.write_spilled(xid, &entries)
    }

    fn write_spilled(&mut self, xid: u32, entries: &[Entry]) -> Result<(), StageError> {
        let add: u64 = entries.iter().map(|e| e.weight() as u64).sum();
        if self.disk_bytes + add > self.disk_bound {
            return Err(StageError::Full {
                xid,
                limit: self.disk_bound,
                dir: self.dir.clone(),
            });
        }
        let staged = self.txns.get_mut(&xid).ok_or(StageError::Protocol(xid))?;
        if staged.spill.is_none() {
            let path = self.dir.join(format!("xid-{xid}{SPILL_SUFFIX}"));
            let file = File::create(&path).map_err(|source| StageError::Io {
                what: "create a spill file",
                path: path.clone(),
                source,
            })?;
            staged.spill = Some(Spill {
                path,
                file: BufWriter::with_capacity(256 * 1024, file),
                bytes: 0,
            });
        }
        let spill = staged.spill.as_mut().ok_or(StageError::Protocol(xid))?;
        for entry in entries {
            let len = u32::try_from(entry.message.len()).map_err(|_| StageError::Protocol(xid))?;
            let written = spill
                .file
                .write_all(&entry.subxid.to_be_bytes())
                .and_then(|()| spill.file.write_all(&len.to_be_bytes()))
                .and_then(|()| spill.file.write_all(&entry.message));
            written.map_err(|source| StageError::Io {
                what: "write a spill file",
                path: spill.path.clone(),
                source,
            })?;
        }
        spill.bytes += add;
        self.disk_bytes += add;
        Ok(())
    }

    /// The streamed transaction `xid` aborted (`subxid == xid`) or its subtransaction `subxid`
    /// did: what they kept is dropped, and never released. An xid the stage does not know kept
    /// nothing (a transaction with no outbox change).
    pub(crate) fn abort(&mut self, xid: u32, subxid: u32) {
        if xid == subxid {
            if let Some(staged) = self.txns.remove(&xid) {
                self.forget(staged);
            }
            return;
        }
        let Some(staged) = self.txns.get_mut(&xid) else { return };
        let before = staged.memory_bytes;
        staged.memory.retain(|e| e.subxid != subxid);
        staged.memory_bytes = staged.memory.iter().map(Entry::weight).sum();
        self.memory_bytes -= before - staged.memory_bytes;
        if staged.spill.is_some() {
            staged.aborted.insert(subxid);
        }
    }

    /// The streamed transaction `xid` committed: what it kept, in order, to publish. The stage
    /// forgets it; its spill file goes when the release is dropped.
    ///
    /// # Errors
    ///
    /// [`StageError::Io`] when its spill file cannot be finished or opened for reading.
    pub(crate) fn release(&mut self, xid: u32) -> Result<Release, StageError> {
        let Some(staged) = self.txns.remove(&xid) else {
            return Ok(Release::default());
        };
        self.memory_bytes -= staged.memory_bytes;
        let spilled = match staged.spill {
            None => None,
            Some(spill) => {
                self.disk_bytes -= spill.bytes;
                let Spill { path, file, .. } = spill;
                let io = |what: &'static str| {
                    let path = path.clone();
                    move |source| StageError::Io { what, path, source }
                };
                let file = file
                    .into_inner()
                    .map_err(|e| e.into_error())
                    .map_err(io("write a spill file"))?;
                drop(file);
                let file = File::open(&path).map_err(io("read a spill file"))?;
                Some(SpillReader {
                    reader: BufReader::with_capacity(256 * 1024, file),
                    path,
                })
            }
        };
        Ok(Release {
            spilled,
            memory: staged.memory.into_iter(),
            aborted: staged.aborted,
        })
    }

    fn forget(&mut self, staged: Staged) {
        self.memory_bytes -= staged.memory_bytes;
        if let Some(spill) = staged.spill {
            self.disk_bytes -= spill.bytes;
            drop(spill.file);
            remove(&spill.path);
        }
    }

    /// Forgets transaction `xid` unread (it went out another way: `early.rs`), spill file
    /// included.
    pub(crate) fn discard(&mut self, xid: u32) {
        self.abort(xid, xid);
    }

    pub(crate) fn usage(&self) -> StageUse {
        StageUse {
            transactions: self.txns.len(),
            memory_bytes: self.memory_bytes,
            disk_bytes: self.disk_bytes,
        }
    }
}

impl Drop for Stage {
    /// A session that ends leaves no spill file behind: its open transactions are streamed again.
    fn drop(&mut self) {
        for (_, staged) in std::mem::take(&mut self.txns) {
            self.forget(staged);
        }
    }
}

fn remove(path: &Path) {
    if let Err(e) = fs::remove_file(path) {
        if e.kind() != ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), error = %e, "could not remove a spill file; the next start removes it");
        }
    }
}

struct SpillReader {
    reader: BufReader<File>,
    path: PathBuf,
}

impl Drop for SpillReader {
    fn drop(&mut self) {
        remove(&self.path);
    }
}

/// A committed streamed transaction's kept messages, read once in order.
#[derive(Default)]
pub(crate) struct Release {
    spilled: Option<SpillReader>,
    memory: std::vec::IntoIter<Entry>,
    aborted: HashSet<u32>,
}

impl Release {
    /// The next kept message (`None`: all were read).
    ///
    /// # Errors
    ///
    /// [`StageError::Io`] when the spill file cannot be read or is cut short.
    pub(crate) fn next_message(&mut self) -> Result<Option<Bytes>, StageError> {
        loop {
            let entry = match &mut self.spilled {
                Some(spill) => match read_entry(spill)? {
                    Some(entry) => entry,
                    None => {
                        self.spilled = None;
                        continue;
                    }
                },
                None => match self.memory.next() {
                    Some(entry) => entry,
                    None => return Ok(None),
                },
            };
            if !self.aborted.contains(&entry.subxid) {
                return Ok(Some(entry.message));
            }
        }
    }
}

fn read_entry(spill: &mut SpillReader) -> Result<Option<Entry>, StageError> {
    let io = |source| StageError::Io {
        what: "read a spill file",
        path: spill.path.clone(),
        source,
    };
    let mut header = [0u8; ENTRY_HEADER];
    match spill.reader.read_exact(&mut header[..1]) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(io(e)),
    }
    spill.reader.read_exact(&mut header[1..]).map_err(io)?;
    let subxid = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
    let mut message = vec![0u8; len];
    spill.reader.read_exact(&mut message).map_err(io)?;
    Ok(Some(Entry {
        subxid,
        message: Bytes::from(message),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &Path, memory_bytes: usize, disk_bytes: u64) -> StageSettings {
        StageSettings {
            dir: dir.to_owned(),
            memory_bytes,
            disk_bytes,
        }
    }

    fn message(n: u32) -> Bytes {
        Bytes::from(format!("message {n:04}").into_bytes())
    }

    fn drain(mut release: Release) -> Vec<Bytes> {
        let mut out = Vec::new();
        while let Some(m) = release.next_message().unwrap() {
            out.push(m);
        }
        out
    }

    fn files(dir: &Path) -> usize {
        fs::read_dir(dir).unwrap().count()
    }

    #[test]
    fn a_transaction_comes_back_in_order_from_memory_and_from_disk() {
        let tmp = tempfile::tempdir().unwrap();
        // Room for about five entries in memory: two transactions of 40 interleaved spill.
        let mut stage = Stage::open(&settings(tmp.path(), 5 * (12 + ENTRY_HEADER), 1 << 20), "slot").unwrap();
        let dir = tmp.path().join("slot");
        for n in 0..40 {
            stage.push(7, Entry::change(7, message(n))).unwrap();
            stage.push(8, Entry::change(8, message(1000 + n))).unwrap();
        }
        let used = stage.usage();
        assert_eq!(used.transactions, 2);
        assert!(used.memory_bytes <= 5 * 20, "{used:?}");
        assert!(used.disk_bytes > 0, "{used:?}");
        assert_eq!(files(&dir), 2, "one spill file per transaction");
        assert_eq!(
            drain(stage.release(8).unwrap()),
            (1000..1040).map(message).collect::<Vec<_>>()
        );
        assert_eq!(files(&dir), 1, "a released transaction's file is gone once read");
        assert_eq!(
            drain(stage.release(7).unwrap()),
            (0..40).map(message).collect::<Vec<_>>()
        );
        assert_eq!(stage.usage(), StageUse::default());
        assert_eq!(files(&dir), 0);
        // A transaction the stage never saw kept nothing.
        assert!(drain(stage.release(99).unwrap()).is_empty());
    }

    #[test]
    fn aborts_drop_a_transaction_or_a_subtransaction_but_not_its_tables() {
        for memory in [1 << 20, 1] {
            let tmp = tempfile::tempdir().unwrap();
            let mut stage = Stage::open(&settings(tmp.path(), memory, 1 << 20), "slot").unwrap();
            stage.push(7, Entry::change(7, message(1))).unwrap();
            stage.push(7, Entry::change(70, message(2))).unwrap();
            stage.push(7, Entry::schema(message(3))).unwrap();
            stage.push(7, Entry::change(70, message(4))).unwrap();
            stage.push(7, Entry::change(71, message(5))).unwrap();
            stage.abort(7, 70);
            stage.push(7, Entry::change(7, message(6))).unwrap();
            stage.push(8, Entry::change(8, message(9))).unwrap();
            stage.abort(8, 8);
            // An abort of what the stage never kept is nothing.
            stage.abort(9, 9);
            stage.abort(9, 90);
            let kept = drain(stage.release(7).unwrap());
            assert_eq!(kept, [1, 3, 5, 6].map(message), "memory bound {memory}");
            assert!(drain(stage.release(8).unwrap()).is_empty());
            assert_eq!(stage.usage(), StageUse::default());
            assert_eq!(files(&tmp.path().join("slot")), 0, "memory bound {memory}");
        }
    }

    #[test]
    fn the_disk_bound_stops_with_a_clear_error() {
        let tmp = tempfile::tempdir().unwrap();
        let mut stage = Stage::open(&settings(tmp.path(), 1, 100), "slot").unwrap();
        for n in 0..5 {
            stage.push(7, Entry::change(7, message(n))).unwrap();
        }
        let err = stage.push(7, Entry::change(7, message(5))).unwrap_err();
        assert!(matches!(err, StageError::Full { xid: 7, limit: 100, .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("relay.stage_disk_bytes") && text.contains("100"),
            "{text}"
        );
    }

    #[test]
    fn opening_removes_what_a_killed_process_left_and_dropping_cleans_up() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("slot");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("xid-5.stage"), b"left over").unwrap();
        fs::write(dir.join("README"), b"not ours").unwrap();
        let mut stage = Stage::open(&settings(tmp.path(), 1, 1 << 20), "slot").unwrap();
        assert!(!dir.join("xid-5.stage").exists());
        assert!(dir.join("README").exists(), "only spill files are removed");
        stage.push(7, Entry::change(7, message(1))).unwrap();
        assert!(dir.join("xid-7.stage").exists());
        drop(stage);
        assert!(!dir.join("xid-7.stage").exists());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _fresh = Stage::open(&settings(tmp.path(), 1, 1 << 20), "fresh").unwrap();
            let mode = fs::metadata(tmp.path().join("fresh")).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "the stage is the relay's alone");
        }
    }
}
