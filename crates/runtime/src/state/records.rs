//! Where the records live: one redb file (`<root>/meta.redb`, mode 0600: the records hold
//! the pods' configs) with a table per kind and a JSON value per id — containerd keeps its
//! metadata in one bolt file the same way.
//!
//! Saves that arrive together commit together: a committer thread takes every write queued
//! while its last commit was syncing into one transaction (one fdatasync), and the savers
//! await their commit without holding a thread, so a burst of pods costs a few syncs rather
//! than a new file, an fsync and a rename per save (on a busy ext4, allocating those inodes
//! was itself a measurable share of a pod's start). A save returns once its transaction is
//! durable, so a crash keeps every save that returned.
//!
//! Records of older nodus versions (one JSON file per id beside the sandbox and container
//! directories) are moved into the store the first time it opens.

use super::{StateError, io};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

type Table = TableDefinition<'static, &'static str, &'static [u8]>;

/// The record database, shared by the kinds' [`Records`].
pub struct RecordStore {
    db: Arc<Database>,
    path: PathBuf,
    queue: Option<std::sync::mpsc::Sender<(Write, Done)>>,
    committer: Option<std::thread::JoinHandle<()>>,
}

impl Drop for RecordStore {
    /// Lets the committer finish what is queued and close the database, so the store can
    /// be opened again as soon as this one is gone.
    fn drop(&mut self) {
        self.queue.take();
        if let Some(t) = self.committer.take() {
            let _ = t.join();
        }
    }
}

type Done = tokio::sync::oneshot::Sender<Result<(), String>>;

enum Write {
    Put {
        table: &'static str,
        id: String,
        value: Vec<u8>,
    },
    Delete {
        table: &'static str,
        id: String,
    },
}

fn db_err(path: &Path) -> impl Fn(redb::Error) -> StateError + '_ {
    move |e| StateError::Corrupt {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

impl RecordStore {
    /// Opens (or creates) the store at `path` and starts its committer thread.
    pub fn open(path: &Path) -> Result<Arc<RecordStore>, StateError> {
        nodus_serving::private::create_file(path).map_err(io(path))?;
        let db = Database::create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StateError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::other(
                    "the record store is open in another process (is another nodus runtime \
                     running on this --root-dir?)",
                ),
            },
            e => db_err(path)(e.into()),
        })?;
        let db = Arc::new(db);
        let (tx, rx) = std::sync::mpsc::channel::<(Write, Done)>();
        let committer = Arc::clone(&db);
        let thread = std::thread::Builder::new()
            .name("nodus-records".into())
            .spawn(move || {
                // Everything queued while the last commit was syncing goes in the next one.
                while let Ok(first) = rx.recv() {
                    let mut batch = vec![first];
                    batch.extend(rx.try_iter());
                    let r = commit(&committer, &batch).map_err(|e| e.to_string());
                    for (_, done) in batch {
                        let _ = done.send(r.clone());
                    }
                }
            })
            .map_err(io(path))?;
        Ok(Arc::new(RecordStore {
            db,
            path: path.to_path_buf(),
            queue: Some(tx),
            committer: Some(thread),
        }))
    }

    /// Queues `w` and returns once a transaction holding it has committed (or failed).
    async fn write(&self, w: Write) -> Result<(), StateError> {
        let (done, rx) = tokio::sync::oneshot::channel();
        let failed = |message: String| StateError::Corrupt {
            path: self.path.clone(),
            message,
        };
        self.queue
            .as_ref()
            .ok_or_else(|| failed("the record store is closed".into()))?
            .send((w, done))
            .map_err(|_| failed("the record store's committer has stopped".into()))?;
        rx.await
            .map_err(|_| failed("the record store's committer has stopped".into()))?
            .map_err(failed)
    }
}

fn commit(db: &Database, batch: &[(Write, Done)]) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    for (w, _) in batch {
        match w {
            Write::Put { table, id, value } => {
                txn.open_table(Table::new(table))?
                    .insert(id.as_str(), value.as_slice())?;
            }
            Write::Delete { table, id } => {
                txn.open_table(Table::new(table))?.remove(id.as_str())?;
            }
        }
    }
    txn.commit()?;
    Ok(())
}

/// The records of one kind (sandboxes, containers): a table of the store.
#[derive(Clone)]
pub struct Records {
    store: Arc<RecordStore>,
    table: &'static str,
}

impl Records {
    /// The table `table` of `store`, with the JSON files an older nodus left in
    /// `legacy_dir` (`<id>.json`) moved into it.
    pub fn open(
        store: &Arc<RecordStore>,
        table: &'static str,
        legacy_dir: &Path,
    ) -> Result<Records, StateError> {
        let path = &store.path;
        let txn = store.db.begin_write().map_err(|e| db_err(path)(e.into()))?;
        txn.open_table(Table::new(table))
            .map_err(|e| db_err(path)(e.into()))?;
        txn.commit().map_err(|e| db_err(path)(e.into()))?;
        let records = Records {
            store: Arc::clone(store),
            table,
        };
        records.import(legacy_dir)?;
        Ok(records)
    }

    fn import(&self, dir: &Path) -> Result<(), StateError> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Ok(());
        };
        let mut moved = Vec::new();
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            // A save's temporary file: the old store's rename never happened.
            if name.starts_with('.') && name.ends_with(".tmp") {
                let _ = std::fs::remove_file(&p);
                continue;
            }
            let Some(id) = name.strip_suffix(".json") else {
                continue;
            };
            if !p.is_file() {
                continue;
            }
            let value = std::fs::read(&p).map_err(io(&p))?;
            futures::executor::block_on(self.store.write(Write::Put {
                table: self.table,
                id: id.to_string(),
                value,
            }))?;
            moved.push(p);
        }
        if !moved.is_empty() {
            tracing::info!(kind = self.table, records = moved.len(), store = %self.store.path.display(), "moved JSON records into the record store");
        }
        for p in moved {
            let _ = std::fs::remove_file(p);
        }
        Ok(())
    }

    /// Saves `rec` as the record of `id`; returns once it is durable.
    pub async fn save<T: Serialize>(&self, id: &str, rec: &T) -> Result<(), StateError> {
        let value = serde_json::to_vec(rec).map_err(|e| StateError::Corrupt {
            path: self.store.path.clone(),
            message: format!("encoding {} record {id}: {e}", self.table),
        })?;
        self.store
            .write(Write::Put {
                table: self.table,
                id: id.to_string(),
                value,
            })
            .await
    }

    /// [`Self::save`] for a caller that is not async (start-up, exit monitors): blocks the
    /// thread until the record is durable.
    pub fn save_blocking<T: Serialize>(&self, id: &str, rec: &T) -> Result<(), StateError> {
        futures::executor::block_on(self.save(id, rec))
    }

    /// [`Self::delete`] for a caller that must not await (it holds a lock).
    pub fn delete_blocking(&self, id: &str) -> Result<(), StateError> {
        futures::executor::block_on(self.delete(id))
    }

    pub async fn delete(&self, id: &str) -> Result<(), StateError> {
        self.store
            .write(Write::Delete {
                table: self.table,
                id: id.to_string(),
            })
            .await
    }

    /// Every record; a corrupt one is reported and skipped, never fatal for the others.
    pub fn load_all<T: for<'de> Deserialize<'de>>(&self) -> Result<Vec<T>, StateError> {
        let path = &self.store.path;
        let read = self
            .store
            .db
            .begin_read()
            .map_err(|e| db_err(path)(e.into()))?;
        let table = read
            .open_table(Table::new(self.table))
            .map_err(|e| db_err(path)(e.into()))?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(|e| db_err(path)(e.into()))? {
            let (k, v) = entry.map_err(|e| db_err(path)(e.into()))?;
            match serde_json::from_slice::<T>(v.value()) {
                Ok(r) => out.push(r),
                Err(e) => tracing::error!(
                    store = %path.display(),
                    kind = self.table,
                    id = k.value(),
                    error = %e,
                    "skipping corrupt state record"
                ),
            }
        }
        Ok(out)
    }

    /// The raw value of `id`, for tests that corrupt or inspect a record.
    #[cfg(test)]
    fn put_raw(&self, id: &str, value: &[u8]) -> Result<(), StateError> {
        futures::executor::block_on(self.store.write(Write::Put {
            table: self.table,
            id: id.to_string(),
            value: value.to_vec(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct R {
        id: String,
        n: u32,
    }

    #[test]
    fn saves_from_many_threads_all_land_and_deletes_remove() {
        let d = tempfile::tempdir().unwrap();
        let store = RecordStore::open(&d.path().join("meta.redb")).unwrap();
        let recs = Records::open(&store, "things", &d.path().join("things")).unwrap();
        std::thread::scope(|s| {
            for t in 0..8u32 {
                let recs = recs.clone();
                s.spawn(move || {
                    for i in 0..25u32 {
                        let id = format!("{t}-{i}");
                        recs.save_blocking(
                            &id,
                            &R {
                                id: id.clone(),
                                n: i,
                            },
                        )
                        .unwrap();
                    }
                });
            }
        });
        assert_eq!(recs.load_all::<R>().unwrap().len(), 200);
        futures::executor::block_on(recs.delete("3-7")).unwrap();
        futures::executor::block_on(recs.delete("not-there")).unwrap();
        let all: Vec<R> = recs.load_all().unwrap();
        assert_eq!(all.len(), 199);
        assert!(!all.iter().any(|r| r.id == "3-7"));
        // Durable across a reopen, and the file is root's alone.
        drop((recs, store));
        let store = RecordStore::open(&d.path().join("meta.redb")).unwrap();
        let recs = Records::open(&store, "things", &d.path().join("things")).unwrap();
        assert_eq!(recs.load_all::<R>().unwrap().len(), 199);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(d.path().join("meta.redb"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_second_open_of_the_same_store_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("meta.redb");
        let _store = RecordStore::open(&path).unwrap();
        let e = RecordStore::open(&path).err().unwrap().to_string();
        assert!(e.contains("another nodus runtime"), "{e}");
    }

    #[test]
    fn legacy_json_records_are_moved_in_and_corrupt_ones_skipped() {
        let d = tempfile::tempdir().unwrap();
        let legacy = d.path().join("sandboxes");
        std::fs::create_dir_all(legacy.join("abc")).unwrap();
        std::fs::write(legacy.join("abc.json"), br#"{"id":"abc","n":1}"#).unwrap();
        std::fs::write(legacy.join("bad.json"), b"{garbage").unwrap();
        std::fs::write(legacy.join(".abc.json.7.tmp"), b"half").unwrap();
        let store = RecordStore::open(&d.path().join("meta.redb")).unwrap();
        let recs = Records::open(&store, "sandboxes", &legacy).unwrap();
        let all: Vec<R> = recs.load_all().unwrap();
        assert_eq!(
            all,
            vec![R {
                id: "abc".into(),
                n: 1
            }]
        );
        // The files are gone; the sandbox's directory is not.
        assert!(!legacy.join("abc.json").exists());
        assert!(!legacy.join(".abc.json.7.tmp").exists());
        assert!(legacy.join("abc").is_dir());
        recs.put_raw("x", b"not json").unwrap();
        assert_eq!(recs.load_all::<R>().unwrap().len(), 1);
    }
}
