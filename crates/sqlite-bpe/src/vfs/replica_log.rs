//! Which pages each replicated transaction changed, read from a Litestream replica's log.
//!
//! Litestream ships a database as LTX files, `<dir>/ltx/<level>/<min>-<max>.ltx` in a directory
//! replica and `<path>/<level, 4 digits>/<min>-<max>.ltx` in a bucket (TXIDs in 16 hex digits;
//! Litestream 0.5's layouts), each holding the pages a run of transactions wrote. The format is open
//! (github.com/superfly/ltx): a 100-byte header, the page frames, then a page index (for each
//! page, in order: its number, offset and size as unsigned varints; a 0 ends it), the index's
//! length as a big-endian u64, and a 16-byte trailer (the database's checksum after the file
//! applies, then the file's own). The tail alone names every page a file changed, so one ranged
//! GET per file tells what a move from one transaction to a later one changed, without reading
//! any page.
//!
//! bpe reads the same replica its base VFS serves from, named by the database URI's
//! `bpe_replica` or by `LITESTREAM_REPLICA_URL` (what Litestream's own loadable VFS reads):
//! `file:///path`, a plain path, or `s3://bucket/path` with `endpoint`, `region` and
//! `force-path-style` as query parameters and keys from `LITESTREAM_ACCESS_KEY_ID` /
//! `AWS_ACCESS_KEY_ID` (and the secrets beside them). Every question this module cannot answer
//! (a gap in the log, an unreadable file, a malformed tail) answers None, and the caller reads
//! the new transaction's pages again: a cost, never a stale page.

use bpe_core::lineage::PageSet;
use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Trailer and index length at the end of every LTX file.
const TRAILER_BYTES: usize = 16;
const INDEX_LEN_BYTES: usize = 8;
/// A tail GET asks for this much; a longer index takes a second GET.
const TAIL_GUESS: usize = 64 << 10;
/// The levels looked at for a run of transactions, finest first (0 holds one file per sync;
/// higher levels hold compactions of it).
const LEVELS: [u32; 4] = [0, 1, 2, 3];
/// Files listed per level and question, at most.
const MAX_LISTED: usize = 1000;
/// Files a move from one transaction to another may span before bpe stops asking the log.
const MAX_FILES_PER_MOVE: usize = 256;
/// A request to object storage gives up after this long (then: a cache miss).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the log says of one LTX file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileTail {
    /// The pages it wrote, 0-based (SQLite's page number less one).
    pub pages: Vec<u64>,
    /// The database's checksum after it applies; 0 where the writer computed none (Litestream
    /// 0.5 sets the header's no-checksum flag and writes 0).
    pub post_apply: u64,
    /// The file's own checksum (of its header, with a timestamp, and its pages).
    pub file_checksum: u64,
}

impl FileTail {
    /// A mark of the database's content at the file's last transaction, if the tail gives one:
    /// the database's checksum, else (no checksum written) the file's own checksum where the
    /// file is of the finest level (`level` 0), the one file that ends at that transaction and
    /// no other. The same content has the same database checksum in every replica; a file
    /// checksum marks one file, so a replica written anew, whose transaction numbers start
    /// again, marks its transactions differently (its files have other timestamps).
    pub fn content_mark(&self, level: u32) -> Option<u64> {
        if self.post_apply != 0 {
            Some(self.post_apply)
        } else if level == 0 && self.file_checksum != 0 {
            Some(self.file_checksum)
        } else {
            None
        }
    }
}

/// One LTX file's place in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct LogFile {
    level: u32,
    min: u64,
    max: u64,
}

/// What changed from one transaction to a later one.
#[derive(Clone, Debug)]
pub struct Move {
    pub changed: PageSet,
    /// The content mark at the later transaction (`FileTail::content_mark`), if a file of
    /// the log that gives one ends there.
    pub checksum_after: Option<u64>,
}

/// A replica's log, as this process reads it. Tails never change, so they are kept.
pub struct ReplicaLog {
    store: Store,
    tails: Mutex<HashMap<LogFile, Arc<FileTail>>>,
}

enum Store {
    Dir(PathBuf),
    S3(Box<S3>),
}

struct S3 {
    bucket: rusty_s3::Bucket,
    credentials: Option<rusty_s3::Credentials>,
    /// The key prefix of the database's log (`<path>/`; its levels below it).
    root: String,
    agent: ureq::Agent,
}

impl ReplicaLog {
    /// The log of the replica `url` names. Err names what is wrong with it.
    pub fn open(url: &str) -> Result<ReplicaLog, String> {
        let store = if let Some(rest) = url.strip_prefix("s3://") {
            Store::S3(Box::new(S3::open(rest)?))
        } else if let Some(path) = url.strip_prefix("file://") {
            Store::Dir(PathBuf::from(path))
        } else if url.starts_with('/') {
            Store::Dir(PathBuf::from(url))
        } else {
            return Err(format!(
                "replica URL {url:?}: bpe reads file:// and s3:// replicas only"
            ));
        };
        Ok(ReplicaLog {
            store,
            tails: Mutex::new(HashMap::new()),
        })
    }

    /// What changed from transaction `from` to transaction `to` (`from < to`), as a superset
    /// of the pages changed; None if the log cannot tell.
    pub fn changes(&self, from: u64, to: u64) -> Option<Move> {
        if from >= to {
            return None;
        }
        let files = LEVELS
            .iter()
            .find_map(|&level| self.covering(level, from, to))?;
        let mut pages = Vec::new();
        let mut checksum_after = None;
        for f in &files {
            let tail = self.tail(*f)?;
            pages.extend_from_slice(&tail.pages);
            if f.max == to {
                checksum_after = tail.content_mark(f.level);
            }
        }
        Some(Move {
            changed: PageSet::new(pages),
            checksum_after,
        })
    }

    /// The content mark at transaction `txid` (`FileTail::content_mark`), if a file of the
    /// log's finest level ends there (looked for among the files that start at most `span` transactions before).
    pub fn checksum_at(&self, txid: u64, span: u64) -> Option<u64> {
        let files = self.list(0, txid.saturating_sub(span)).ok()?;
        let f = files.into_iter().find(|f| f.max == txid)?;
        self.tail(f)?.content_mark(0)
    }

    /// (TXID, content mark) where files of the finest level end, for the newest `limit`
    /// such files that start after `since` and end before `before`, newest first: where an
    /// earlier snapshot may be found.
    pub fn checksums_before(&self, since: u64, before: u64, limit: usize) -> Vec<(u64, u64)> {
        let mut files = self.list(0, since).unwrap_or_default();
        files.retain(|f| f.max < before);
        files.sort_unstable_by_key(|f| std::cmp::Reverse(f.max));
        files
            .into_iter()
            .take(limit)
            .filter_map(|f| Some((f.max, self.tail(f)?.content_mark(0)?)))
            .collect()
    }

    /// Files of `level` that together cover transactions `from + 1 ..= to` with no gap.
    fn covering(&self, level: u32, from: u64, to: u64) -> Option<Vec<LogFile>> {
        // A file that starts at or before `from` may still reach past it (a compaction).
        let lookback = if level == 0 { 16 } else { 4096 };
        let files = self.list(level, from.saturating_sub(lookback)).ok()?;
        let mut need = from + 1;
        let mut chosen = Vec::new();
        for f in files {
            if f.max < need {
                continue;
            }
            if f.min > need || chosen.len() == MAX_FILES_PER_MOVE {
                return None;
            }
            chosen.push(f);
            need = f.max + 1;
            if need > to {
                return Some(chosen);
            }
        }
        None
    }

    /// Files of `level` whose first transaction is after `after`, in order.
    fn list(&self, level: u32, after: u64) -> Result<Vec<LogFile>, String> {
        let mut files = match &self.store {
            Store::Dir(root) => {
                let dir = root.join("ltx").join(level.to_string());
                let entries = match std::fs::read_dir(&dir) {
                    Ok(entries) => entries,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                    Err(e) => return Err(format!("{}: {e}", dir.display())),
                };
                entries
                    .filter_map(|e| e.ok())
                    .filter_map(|e| parse_name(level, e.file_name().to_str()?))
                    .filter(|f| f.min > after)
                    .collect()
            }
            Store::S3(s3) => s3.list(level, after)?,
        };
        files.sort_unstable();
        files.truncate(MAX_LISTED);
        Ok(files)
    }

    /// The tail of `f`, from this process's memory if read before.
    fn tail(&self, f: LogFile) -> Option<Arc<FileTail>> {
        if let Some(t) = self.lock_tails().get(&f) {
            return Some(t.clone());
        }
        let tail = Arc::new(self.read_tail(f).ok()?);
        self.lock_tails().insert(f, tail.clone());
        Some(tail)
    }

    fn lock_tails(&self) -> std::sync::MutexGuard<'_, HashMap<LogFile, Arc<FileTail>>> {
        self.tails.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn read_tail(&self, f: LogFile) -> Result<FileTail, String> {
        let name = file_name(f.min, f.max);
        let bytes = match &self.store {
            Store::Dir(root) => {
                read_file_tail(&root.join("ltx").join(f.level.to_string()).join(&name))?
            }
            Store::S3(s3) => s3.tail(&format!("{}{name}", s3.level_prefix(f.level)))?,
        };
        parse_tail(&bytes)
    }
}

/// `<min>-<max>.ltx`, 16 lower-case hex digits each.
fn file_name(min: u64, max: u64) -> String {
    format!("{min:016x}-{max:016x}.ltx")
}

fn parse_name(level: u32, name: &str) -> Option<LogFile> {
    let stem = name.strip_suffix(".ltx")?;
    let (min, max) = stem.split_once('-')?;
    if min.len() != 16 || max.len() != 16 {
        return None;
    }
    let (min, max) = (
        u64::from_str_radix(min, 16).ok()?,
        u64::from_str_radix(max, 16).ok()?,
    );
    (min >= 1 && min <= max).then_some(LogFile { level, min, max })
}

/// The last bytes of a local file: the index, its length and the trailer (or all of it).
fn read_file_tail(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::{Seek, SeekFrom};
    let mut file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let mut want = (TAIL_GUESS as u64).min(len);
    loop {
        file.seek(SeekFrom::Start(len - want))
            .map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; want as usize];
        file.read_exact(&mut buf).map_err(|e| e.to_string())?;
        match tail_needs(&buf) {
            Some(n) if n as u64 > want && n as u64 <= len => want = n as u64,
            _ => return Ok(buf),
        }
    }
}

/// The tail length a parse needs, if `bytes` (the file's last bytes) holds less.
fn tail_needs(bytes: &[u8]) -> Option<usize> {
    let n = bytes.len();
    if n < TRAILER_BYTES + INDEX_LEN_BYTES {
        return None;
    }
    let at = n - TRAILER_BYTES - INDEX_LEN_BYTES;
    let index_len = u64::from_be_bytes(bytes[at..at + 8].try_into().ok()?) as usize;
    let need = index_len.checked_add(TRAILER_BYTES + INDEX_LEN_BYTES)?;
    (need > n).then_some(need)
}

/// The page numbers and post-apply checksum in an LTX file's last bytes (at least its index,
/// the index length and the trailer).
pub fn parse_tail(bytes: &[u8]) -> Result<FileTail, String> {
    let n = bytes.len();
    if n < TRAILER_BYTES + INDEX_LEN_BYTES {
        return Err(format!("an LTX tail of {n} bytes is too short"));
    }
    let trailer = &bytes[n - TRAILER_BYTES..];
    let post_apply = u64::from_be_bytes(trailer[..8].try_into().expect("8 bytes"));
    let file_checksum = u64::from_be_bytes(trailer[8..].try_into().expect("8 bytes"));
    let at = n - TRAILER_BYTES - INDEX_LEN_BYTES;
    let index_len = u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes")) as usize;
    if index_len == 0 || index_len > at {
        return Err(format!(
            "an LTX page index of {index_len} bytes does not fit its tail"
        ));
    }
    let mut index = &bytes[at - index_len..at];
    let mut pages = Vec::new();
    let mut last = 0u64;
    loop {
        let pgno = read_uvarint(&mut index)?;
        if pgno == 0 {
            break;
        }
        // Offset and size: not needed here, but they must parse.
        read_uvarint(&mut index)?;
        read_uvarint(&mut index)?;
        if pgno <= last || pgno > u32::MAX as u64 {
            return Err(format!("LTX page index out of order at page {pgno}"));
        }
        last = pgno;
        pages.push(pgno - 1);
    }
    if !index.is_empty() {
        return Err(format!(
            "{} bytes after the LTX page index's end",
            index.len()
        ));
    }
    Ok(FileTail {
        pages,
        post_apply,
        file_checksum,
    })
}

/// An unsigned LEB128 varint (Go's `binary.Uvarint`).
fn read_uvarint(bytes: &mut &[u8]) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes
            .split_first()
            .ok_or("an LTX page index ends inside a number")?;
        *bytes = rest;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("an LTX page index number longer than 64 bits".into())
}

impl S3 {
    /// `rest`: `bucket/path?query` of an `s3://` URL.
    fn open(rest: &str) -> Result<S3, String> {
        let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, path) = location.split_once('/').unwrap_or((location, ""));
        if bucket.is_empty() {
            return Err(format!("replica URL s3://{rest}: no bucket"));
        }
        // Values are percent-encoded as in any URL (`endpoint=http%3A%2F%2Fhost%3A9000`, as
        // Litestream writes them too): decoded before use.
        let param = |name: &str| {
            url::form_urlencoded::parse(query.as_bytes())
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.into_owned())
        };
        let env = |names: &[&str]| names.iter().find_map(|n| std::env::var(n).ok());
        let region = param("region")
            .or_else(|| env(&["LITESTREAM_REGION", "AWS_REGION"]))
            .unwrap_or_else(|| "us-east-1".to_string());
        let (endpoint, style) = match param("endpoint") {
            Some(e) => (e, rusty_s3::UrlStyle::Path),
            None if param("force-path-style").as_deref() == Some("true") => (
                format!("https://s3.{region}.amazonaws.com"),
                rusty_s3::UrlStyle::Path,
            ),
            None => (
                format!("https://s3.{region}.amazonaws.com"),
                rusty_s3::UrlStyle::VirtualHost,
            ),
        };
        let endpoint: url::Url = endpoint
            .parse()
            .map_err(|e| format!("replica endpoint {endpoint:?}: {e}"))?;
        let bucket = rusty_s3::Bucket::new(endpoint, style, bucket.to_string(), region)
            .map_err(|e| format!("replica bucket {bucket:?}: {e}"))?;
        let key = env(&["LITESTREAM_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"]);
        let secret = env(&["LITESTREAM_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"]);
        let credentials = key
            .zip(secret)
            .map(|(k, s)| rusty_s3::Credentials::new(k, s));
        let path = path.trim_matches('/');
        let root = if path.is_empty() {
            String::new()
        } else {
            format!("{path}/")
        };
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(REQUEST_TIMEOUT))
            .build()
            .into();
        Ok(S3 {
            bucket,
            credentials,
            root,
            agent,
        })
    }

    /// The key prefix of a level's files: `<path>/0000/` for level 0.
    fn level_prefix(&self, level: u32) -> String {
        format!("{}{level:04}/", self.root)
    }

    fn list(&self, level: u32, after: u64) -> Result<Vec<LogFile>, String> {
        use rusty_s3::S3Action;
        let prefix = self.level_prefix(level);
        // Every file whose first transaction is `after` or less sorts at or before this name.
        let start_after = format!("{prefix}{}", file_name(after, u64::MAX));
        let mut action = self.bucket.list_objects_v2(self.credentials.as_ref());
        action.with_prefix(prefix.as_str());
        action.with_start_after(start_after.as_str());
        let url = action.sign(Duration::from_secs(60));
        let body = self
            .agent
            .get(url.as_str())
            .call()
            .map_err(|e| format!("listing {prefix}: {e}"))?
            .body_mut()
            .read_to_string()
            .map_err(|e| format!("listing {prefix}: {e}"))?;
        let listed = rusty_s3::actions::ListObjectsV2::parse_response(&body)
            .map_err(|e| format!("listing {prefix}: {e}"))?;
        Ok(listed
            .contents
            .iter()
            .filter_map(|c| parse_name(level, c.key.strip_prefix(&prefix)?))
            .filter(|f| f.min > after)
            .collect())
    }

    /// The last bytes of the object `key`, enough for `parse_tail`.
    fn tail(&self, key: &str) -> Result<Vec<u8>, String> {
        let mut bytes = self.get_suffix(key, TAIL_GUESS)?;
        if let Some(need) = tail_needs(&bytes) {
            if bytes.len() == TAIL_GUESS {
                bytes = self.get_suffix(key, need)?;
            }
        }
        Ok(bytes)
    }

    fn get_suffix(&self, key: &str, len: usize) -> Result<Vec<u8>, String> {
        use rusty_s3::S3Action;
        let url = self
            .bucket
            .get_object(self.credentials.as_ref(), key)
            .sign(Duration::from_secs(60));
        self.agent
            .get(url.as_str())
            .header("Range", format!("bytes=-{len}"))
            .call()
            .map_err(|e| format!("{key}: {e}"))?
            .body_mut()
            .with_config()
            .limit(len as u64 + 1)
            .read_to_vec()
            .map_err(|e| format!("{key}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uvarint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// An LTX file's tail as the format describes it: the pages (1-based), then the checksum.
    fn tail(pages: &[u64], post_apply: u64) -> Vec<u8> {
        let mut bytes = vec![0xAA; 100]; // header and frames: not read
        let mut index = Vec::new();
        for (i, &p) in pages.iter().enumerate() {
            uvarint(p, &mut index);
            uvarint(100 + 4000 * i as u64, &mut index);
            uvarint(4000, &mut index);
        }
        uvarint(0, &mut index);
        bytes.extend_from_slice(&index);
        bytes.extend_from_slice(&(index.len() as u64).to_be_bytes());
        bytes.extend_from_slice(&post_apply.to_be_bytes());
        bytes.extend_from_slice(&0x8000_0000_0000_0001u64.to_be_bytes());
        bytes
    }

    #[test]
    fn a_tail_names_its_pages_zero_based_and_its_checksum() {
        let t = parse_tail(&tail(&[1, 2, 300, 70000], 0x8123)).unwrap();
        assert_eq!(t.pages, vec![0, 1, 299, 69999]);
        assert_eq!(t.post_apply, 0x8123);
    }

    #[test]
    fn without_a_database_checksum_only_a_finest_level_file_marks_the_content() {
        // Litestream 0.5 writes no database checksum (0) but a checksum of each file.
        let t = parse_tail(&tail(&[1], 0)).unwrap();
        assert_eq!(t.file_checksum, 0x8000_0000_0000_0001);
        assert_eq!(t.content_mark(0), Some(0x8000_0000_0000_0001));
        assert_eq!(
            t.content_mark(1),
            None,
            "a compacted file ends where a level-0 file does"
        );
        let t = parse_tail(&tail(&[1], 0x8123)).unwrap();
        assert_eq!(t.content_mark(0), Some(0x8123));
        assert_eq!(
            t.content_mark(3),
            Some(0x8123),
            "the database's checksum at any level"
        );
    }

    #[test]
    fn a_malformed_tail_is_refused() {
        let good = tail(&[1, 5], 7);
        assert!(parse_tail(&good[good.len() - 10..]).is_err());
        let mut unordered = tail(&[5, 1], 7);
        assert!(parse_tail(&unordered).is_err());
        // An index length pointing past the start.
        let n = unordered.len();
        unordered[n - 24..n - 16].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(parse_tail(&unordered).is_err());
    }

    #[test]
    fn names_parse_as_litestream_writes_them() {
        assert_eq!(
            parse_name(0, &file_name(3, 0x1f)),
            Some(LogFile {
                level: 0,
                min: 3,
                max: 0x1f
            })
        );
        assert_eq!(parse_name(0, "0000000000000003-0000000000000002.ltx"), None);
        assert_eq!(parse_name(0, "x.ltx"), None);
    }

    /// A log directory as Litestream lays one out.
    fn log_dir(files: &[(u32, u64, u64, &[u64])]) -> (tempfile::TempDir, ReplicaLog) {
        let dir = tempfile::tempdir().unwrap();
        for &(level, min, max, pages) in files {
            let d = dir.path().join("ltx").join(level.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(file_name(min, max)), tail(pages, max * 10)).unwrap();
        }
        let url = format!("file://{}", dir.path().display());
        let log = ReplicaLog::open(&url).unwrap();
        (dir, log)
    }

    #[test]
    fn a_move_unites_the_pages_of_the_files_between() {
        let (_d, log) = log_dir(&[
            (0, 1, 1, &[1, 2, 3, 4]),
            (0, 2, 2, &[2]),
            (0, 3, 4, &[4, 9]),
            (0, 5, 5, &[3]),
        ]);
        let m = log.changes(1, 4).unwrap();
        assert_eq!(m.changed, PageSet::new(vec![1, 3, 8]));
        assert_eq!(m.checksum_after, Some(40));
        // Ending inside a file: its pages count (a superset), the checksum is unknown.
        let m = log.changes(2, 3).unwrap();
        assert_eq!(m.changed, PageSet::new(vec![3, 8]));
        assert_eq!(m.checksum_after, None);
        assert_eq!(log.checksum_at(5, 10), Some(50));
        assert_eq!(
            log.checksums_before(1, 5, 2),
            vec![(4, 40), (2, 20)],
            "newest first, before 5, at most 2"
        );
    }

    #[test]
    fn a_gap_in_the_finest_level_is_covered_by_a_coarser_one_or_answers_none() {
        let (_d, log) = log_dir(&[(0, 1, 1, &[1]), (0, 3, 3, &[3]), (1, 1, 3, &[1, 2, 3])]);
        let m = log.changes(1, 3).unwrap();
        assert_eq!(m.changed, PageSet::new(vec![0, 1, 2]), "level 1's superset");
        let (_d, log) = log_dir(&[(0, 1, 1, &[1]), (0, 3, 3, &[3])]);
        assert!(log.changes(1, 3).is_none());
        assert!(log.changes(3, 3).is_none());
    }

    #[test]
    fn an_s3_endpoint_is_read_percent_encoded_as_well_as_plain() {
        for rest in [
            "bucket/app/db?endpoint=http%3A%2F%2F127.0.0.1%3A9000&force-path-style=true",
            "bucket/app/db?endpoint=http://127.0.0.1:9000&region=us-east-1",
        ] {
            let s3 = S3::open(rest).unwrap();
            assert_eq!(
                s3.bucket.base_url().as_str(),
                "http://127.0.0.1:9000/bucket/",
                "{rest}"
            );
            assert_eq!(s3.level_prefix(0), "app/db/0000/");
            assert_eq!(s3.level_prefix(9), "app/db/0009/");
        }
    }

    #[test]
    fn an_unknown_scheme_is_refused_by_name() {
        let err = ReplicaLog::open("gs://bucket/db").err().unwrap();
        assert!(err.contains("file:// and s3://"), "{err}");
        assert!(ReplicaLog::open("s3:///db").is_err());
    }
}
