//! Counters published for other processes of the same user (a live monitor, like perfmon).
//!
//! A process with an engine writes one small text file, `<pid>.counters`, into a directory only
//! its user can enter (`/dev/shm/sqlite-bpe-<uid>`, mode 0700; the file 0600), about once a
//! second from a background thread: the query path never touches it. Each write goes to a
//! temporary file that is renamed over the last, so a reader always sees one whole sample. A
//! process that dies leaves its file behind; readers recognise it (the pid is gone, or belongs
//! to a process that started at another time) and remove it.
//!
//! The format, one item per line, tab-separated:
//!
//! ```text
//! sqlite-bpe counters 1
//! pid       <pid>
//! started   <the process's start time, in clock ticks since boot (/proc/<pid>/stat field 22)>
//! time_ms   <when the sample was taken, ms since the Unix epoch>
//! state     <the extension's state description>
//! counter   <cntr_type>  <value>  <counter name>
//! ```

use crate::counters::{CounterKind, CounterRow};
use crate::engine::ExtensionState;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

const MAGIC: &str = "sqlite-bpe counters 1";
const SUFFIX: &str = "counters";

/// One published sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub pid: i32,
    pub started: u64,
    pub time_ms: u64,
    pub state: String,
    /// (counter name, cntr_type, value), in the DMV's order.
    pub counters: Vec<(String, i64, i64)>,
}

impl Sample {
    /// A sample of `rows` and `state`, taken now, for this process.
    pub fn now(rows: &[CounterRow], state: ExtensionState) -> Sample {
        let pid = std::process::id() as i32;
        Sample {
            pid,
            started: process_start(pid).unwrap_or(0),
            time_ms: unix_ms(),
            state: state.description().to_string(),
            counters: rows
                .iter()
                .map(|r| (r.name.to_string(), r.kind.cntr_type(), r.value))
                .collect(),
        }
    }

    /// The value of counter `name`, if published.
    pub fn value(&self, name: &str) -> Option<i64> {
        self.counters
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|&(_, _, v)| v)
    }

    fn to_text(&self) -> String {
        let mut s = format!(
            "{MAGIC}\npid\t{}\nstarted\t{}\ntime_ms\t{}\nstate\t{}\n",
            self.pid, self.started, self.time_ms, self.state
        );
        for (name, kind, value) in &self.counters {
            s.push_str(&format!("counter\t{kind}\t{value}\t{name}\n"));
        }
        s
    }

    fn parse(text: &str) -> Option<Sample> {
        let mut lines = text.lines();
        if lines.next()? != MAGIC {
            return None;
        }
        let mut s = Sample {
            pid: 0,
            started: 0,
            time_ms: 0,
            state: String::new(),
            counters: Vec::new(),
        };
        for line in lines {
            let (key, rest) = line.split_once('\t')?;
            match key {
                "pid" => s.pid = rest.parse().ok()?,
                "started" => s.started = rest.parse().ok()?,
                "time_ms" => s.time_ms = rest.parse().ok()?,
                "state" => s.state = rest.to_string(),
                "counter" => {
                    let mut f = rest.splitn(3, '\t');
                    let kind = f.next()?.parse().ok()?;
                    let value = f.next()?.parse().ok()?;
                    s.counters.push((f.next()?.to_string(), kind, value));
                }
                _ => {} // a later version's item: skipped
            }
        }
        (s.pid > 0).then_some(s)
    }
}

/// Whether a cntr_type is a cumulative count (a rate is its difference over time).
pub fn is_cumulative(cntr_type: i64) -> bool {
    cntr_type == CounterKind::Cumulative.cntr_type()
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The start time of process `pid` in clock ticks since boot, telling a pid's reuse apart.
fn process_start(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// The directory samples go to: under /dev/shm (memory) where there is one, else the temp dir.
pub fn directory() -> PathBuf {
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    base.join(format!("sqlite-bpe-{}", uid()))
}

/// The directory, created 0700 if missing; None if it is not ours alone (then nothing is
/// published: another user could read or plant samples there).
pub(crate) fn own_directory() -> Option<PathBuf> {
    let dir = directory();
    let _ = fs::DirBuilder::new().mode(0o700).create(&dir);
    let meta = fs::symlink_metadata(&dir).ok()?;
    (meta.is_dir() && meta.uid() == uid() && meta.permissions().mode() & 0o077 == 0).then_some(dir)
}

fn file_of(dir: &Path, pid: i32) -> PathBuf {
    dir.join(format!("{pid}.{SUFFIX}"))
}

/// Writes `sample` as this process's published counters (a whole file, renamed into place).
/// `PermissionDenied` when the directory is not this user's alone (publishing there never will
/// be safe); other errors (a full /dev/shm) may pass.
pub fn publish(sample: &Sample) -> std::io::Result<()> {
    let dir = own_directory().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the counters directory is not this user's alone",
        )
    })?;
    let tmp = dir.join(format!("{}.tmp", sample.pid));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(sample.to_text().as_bytes())?;
    drop(f);
    fs::rename(&tmp, file_of(&dir, sample.pid))
}

/// Removes this process's published counters (at exit).
pub fn unpublish(pid: i32) {
    let _ = fs::remove_file(file_of(&directory(), pid));
}

/// The latest sample of process `pid`, if it is alive and publishes.
pub fn read(pid: i32) -> Option<Sample> {
    let path = file_of(&directory(), pid);
    let sample = Sample::parse(&fs::read_to_string(&path).ok()?)?;
    if sample.pid != pid || process_start(pid) != Some(sample.started) {
        // Its process is gone (or the pid now names another): a leftover.
        let _ = fs::remove_file(&path);
        return None;
    }
    Some(sample)
}

/// The latest samples of every live process of this user that publishes, by pid.
pub fn list() -> Vec<Sample> {
    let Ok(entries) = fs::read_dir(directory()) else {
        return Vec::new();
    };
    let mut out: Vec<Sample> = entries
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let pid = name.strip_suffix(&format!(".{SUFFIX}"))?.parse().ok()?;
            read(pid)
        })
        .collect();
    out.sort_by_key(|s| s.pid);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Sample {
        Sample {
            pid: 42,
            started: 7,
            time_ms: 1_000,
            state: "BUFFER POOL EXTENSION ENABLED".into(),
            counters: vec![
                ("Page lookups/sec".into(), 272696576, 12),
                ("Buffer cache hit ratio".into(), 537003264, 9),
            ],
        }
    }

    #[test]
    fn a_sample_reads_back_as_written() {
        let s = sample();
        assert_eq!(Sample::parse(&s.to_text()), Some(s));
    }

    #[test]
    fn a_file_that_is_not_a_sample_is_refused() {
        assert_eq!(Sample::parse("hello\npid\t1\n"), None);
        assert_eq!(Sample::parse(&format!("{MAGIC}\npid\tx\n")), None);
        assert_eq!(Sample::parse(MAGIC), None);
    }

    /// One test: both cases use this process's own file.
    #[test]
    fn this_process_publishes_reads_back_unpublishes_and_a_leftover_is_removed() {
        let mut s = sample();
        s.pid = std::process::id() as i32;
        s.started = process_start(s.pid).unwrap();
        publish(&s).unwrap();
        let path = file_of(&directory(), s.pid);
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(read(s.pid), Some(s.clone()));
        assert!(list().iter().any(|l| l.pid == s.pid));
        unpublish(s.pid);
        assert_eq!(read(s.pid), None);

        // Our pid with another start time: a process that has gone, whose pid was reused.
        s.started += 1;
        fs::write(&path, s.to_text()).unwrap();
        assert_eq!(read(s.pid), None);
        assert!(!path.exists(), "the leftover was not removed");
    }
}
