//! Counters published for other processes of the same user (a live monitor, like perfmon).
//!
//! A process with an engine writes one small text file, `<pid>.counters`, into a directory only
//! its user can enter (`/dev/shm/sqlite-bpe-<uid>`, mode 0700; the file 0600), about once a
//! second from a background thread: the query path never touches it. Each write goes to a
//! temporary file that is renamed over the last, so a reader always sees one whole sample. A
//! process that dies leaves its file behind; readers recognise it (the pid is gone, or belongs
//! to a process that started at another time) and remove it. Writers and readers alike use the
//! directory only if it is this user's alone (this user's, mode 0700, not a symbolic link), and
//! readers read only this user's files in it: another local user who made the directory first
//! could otherwise plant samples there. Such a directory is refused, and the refusal says why.
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

use crate::counters::{CounterKind, CounterRow, HistogramSnapshot};
use crate::io::own_file::Access;
use crate::io::shm_dir::{base, own_directory, own_directory_in, uid};
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
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
    /// The latency histograms beside the counters (`Engine::histograms`).
    pub histograms: Vec<HistogramSnapshot>,
}

impl Sample {
    /// A sample of `rows` and the extension's state (its description), taken now, for this
    /// process.
    pub fn now(rows: &[CounterRow], state: &str) -> Sample {
        let pid = std::process::id() as i32;
        Sample {
            pid,
            started: process_start(pid).unwrap_or(0),
            time_ms: unix_ms(),
            state: state.to_string(),
            counters: rows
                .iter()
                .map(|r| (r.name.to_string(), r.kind.cntr_type(), r.value))
                .collect(),
            histograms: Vec::new(),
        }
    }

    /// The sample with the engine's latency histograms.
    pub fn with_histograms(mut self, histograms: Vec<HistogramSnapshot>) -> Sample {
        self.histograms = histograms;
        self
    }

    /// The histogram `name`, if published.
    pub fn histogram(&self, name: &str) -> Option<&HistogramSnapshot> {
        self.histograms.iter().find(|h| h.name == name)
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
        for h in &self.histograms {
            let buckets: Vec<String> = h.buckets.iter().map(u64::to_string).collect();
            s.push_str(&format!("histogram\t{}\t{}\n", buckets.join(","), h.name));
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
            histograms: Vec::new(),
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
                "histogram" => {
                    let (buckets, name) = rest.split_once('\t')?;
                    let buckets = buckets
                        .split(',')
                        .map(|b| b.parse().ok())
                        .collect::<Option<Vec<u64>>>()?;
                    s.histograms.push(HistogramSnapshot {
                        name: name.to_string(),
                        buckets,
                    });
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

/// The directory samples go to: under /dev/shm (memory) where there is one, else the temp dir.
pub fn directory() -> PathBuf {
    crate::io::shm_dir::directory()
}

/// Why the counters are not read, if this user's directory is there but not this user's alone
/// (for the monitor to say).
pub fn refusal() -> Option<String> {
    match own_directory_in(&base(), false) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Some(e.to_string()),
        _ => None,
    }
}

fn file_of(dir: &Path, pid: i32) -> PathBuf {
    dir.join(format!("{pid}.{SUFFIX}"))
}

/// Writes `sample` as this process's published counters (a whole file, renamed into place).
/// `PermissionDenied` (naming the directory and why) when the directory is not this user's
/// alone (publishing there never will be safe); other errors (a full /dev/shm) may pass.
pub fn publish(sample: &Sample) -> std::io::Result<()> {
    let dir = own_directory()?;
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
    if let Ok(dir) = own_directory_in(&base(), false) {
        let _ = fs::remove_file(file_of(&dir, pid));
    }
}

/// The latest sample of process `pid`, if it is alive and publishes.
pub fn read(pid: i32) -> Option<Sample> {
    read_in(&base(), pid)
}

/// [`read`] from this user's directory under `base`, only if it is this user's alone.
fn read_in(base: &Path, pid: i32) -> Option<Sample> {
    read_from(&own_directory_in(base, false).ok()?, pid)
}

/// The sample of process `pid` in `dir` (checked to be this user's alone), only from a file of
/// this user's (not a symbolic link, nor another user's file: only root could put one there).
fn read_from(dir: &Path, pid: i32) -> Option<Sample> {
    let path = file_of(dir, pid);
    let mut file = crate::io::own_file::open(&path, Access::Inspect).ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.uid() != uid() {
        return None;
    }
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    let sample = Sample::parse(&text)?;
    if sample.pid != pid || process_start(pid) != Some(sample.started) {
        // Its process is gone (or the pid now names another): a leftover.
        let _ = fs::remove_file(&path);
        return None;
    }
    Some(sample)
}

/// Removes the samples of processes that are gone (killed before they could unpublish).
pub fn remove_leftovers() {
    // Reading each sample checks its process and removes a leftover.
    drop(list());
}

/// The latest samples of every live process of this user that publishes, by pid.
pub fn list() -> Vec<Sample> {
    list_in(&base())
}

/// [`list`] from this user's directory under `base`, only if it is this user's alone.
fn list_in(base: &Path) -> Vec<Sample> {
    let Ok(dir) = own_directory_in(base, false) else {
        return Vec::new();
    };
    let Ok(entries) = fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<Sample> = entries
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            if let Some(pid) = name.strip_suffix(".tmp").and_then(|p| p.parse().ok()) {
                // A sample half written by a process killed before its rename: nothing else
                // would ever remove it. (A live process's is left alone; a pid reused since
                // only costs that process one second's sample.)
                if process_start(pid).is_none() {
                    let _ = fs::remove_file(dir.join(&name));
                }
                return None;
            }
            let pid = name.strip_suffix(&format!(".{SUFFIX}"))?.parse().ok()?;
            read_from(&dir, pid)
        })
        .collect();
    out.sort_by_key(|s| s.pid);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::shm_dir::{directory_in, is_in_namespace};
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};

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
            histograms: vec![HistogramSnapshot {
                name: "Extension read time".into(),
                buckets: vec![0, 3, 0, 1],
            }],
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

    /// A sample that reads as live: this process's pid and start time (what anyone can read in
    /// /proc), as another user could plant it.
    fn forged() -> Sample {
        let mut s = sample();
        s.pid = std::process::id() as i32;
        s.started = process_start(s.pid).unwrap();
        s.state = "FORGED".into();
        s
    }

    fn root() -> bool {
        uid() == 0
    }

    /// Samples are read only from this user's own directory (mode 0700, not a symbolic link)
    /// and only from files of this user: another local user who made the directory first, or a
    /// directory anyone may write, could otherwise show the monitor a forged sample. The base
    /// directory is a temporary one (the real one is shared by the tests running at the same
    /// time). A directory or a file of another user needs root to make (`chown`).
    /// A process killed between writing its sample and renaming it into place leaves a
    /// `<pid>.tmp`; the next listing removes it once the process is gone, and only then.
    #[test]
    fn a_half_written_sample_of_a_dead_process_is_removed() {
        let base = tempfile::tempdir().unwrap();
        let dir = directory_in(base.path());
        fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id() as i32;
        child.wait().unwrap();
        let (gone, live) = (
            dir.join(format!("{dead}.tmp")),
            dir.join(format!("{}.tmp", std::process::id())),
        );
        fs::write(&gone, "").unwrap();
        fs::write(&live, "").unwrap();
        assert_eq!(list_in(base.path()), Vec::new());
        assert!(
            !gone.exists(),
            "a dead process's half-written sample stayed"
        );
        assert!(
            live.exists(),
            "a live process's sample in the making was removed"
        );
    }

    #[test]
    fn samples_are_read_only_from_this_users_private_directory_and_own_files() {
        let base = tempfile::tempdir().unwrap();
        let base = base.path();
        let dir = directory_in(base);
        let s = forged();
        let plant = |dir: &Path| {
            fs::create_dir_all(dir).unwrap();
            fs::write(file_of(dir, s.pid), s.to_text()).unwrap();
        };
        let unseen = |why: &str| {
            assert_eq!(read_in(base, s.pid), None, "read: {why}");
            assert_eq!(list_in(base), Vec::new(), "listed: {why}");
        };

        // This user's own directory, 0700: read and listed.
        plant(&dir);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(read_in(base, s.pid), Some(s.clone()));
        assert_eq!(list_in(base), vec![s.clone()]);

        // Open to others (anyone could have planted it).
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        unseen("a directory others may write");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();

        // A symbolic link in place of the directory, to a directory of ours.
        let elsewhere = base.join("elsewhere");
        fs::rename(&dir, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
        unseen("a symbolic link for the directory");
        fs::remove_file(&dir).unwrap();
        fs::rename(&elsewhere, &dir).unwrap();

        // A file that is a symbolic link (to the sample elsewhere).
        let file = file_of(&dir, s.pid);
        fs::rename(&file, base.join("sample")).unwrap();
        std::os::unix::fs::symlink(base.join("sample"), &file).unwrap();
        unseen("a symbolic link for the file");
        fs::remove_file(&file).unwrap();
        fs::rename(base.join("sample"), &file).unwrap();
        assert_eq!(read_in(base, s.pid), Some(s.clone()));

        if !root() {
            println!("SKIPPED the other user's directory and file: needs root (chown)");
            return;
        }
        // Another user's file in our directory.
        std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
        unseen("another user's file");
        std::os::unix::fs::chown(&file, Some(uid()), None).unwrap();
        assert_eq!(read_in(base, s.pid), Some(s.clone()));

        // Another user's directory, 0700, made before ours (the file in it is "ours").
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        unseen("another user's directory");
        assert!(
            file.exists(),
            "a file in another user's directory was removed"
        );
    }

    /// Why a directory is refused is said, naming it: the refusal must be visible (the
    /// publisher says it through sqlite3_log, a shared extension in its last failure).
    #[test]
    fn a_directory_not_this_users_alone_is_refused_naming_it_and_why() {
        let base = tempfile::tempdir().unwrap();
        let base = base.path();
        let dir = directory_in(base);
        let refused = |create: bool| {
            let e = own_directory_in(base, create).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
            assert!(e.to_string().contains(&dir.display().to_string()), "{e}");
            e.to_string()
        };
        assert_eq!(
            own_directory_in(base, false).unwrap_err().kind(),
            std::io::ErrorKind::NotFound
        );
        assert_eq!(own_directory_in(base, true).unwrap(), dir);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let e = refused(true);
        assert!(e.contains("mode is 0755"), "{e}");
        fs::remove_dir(&dir).unwrap();
        fs::create_dir(base.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(base.join("elsewhere"), &dir).unwrap();
        assert!(refused(false).contains("symbolic link"));
        fs::remove_file(&dir).unwrap();
        if root() {
            fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
            std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
            assert!(refused(true).contains("uid 65534"));
        }
    }

    /// Our own names in /dev/shm (a database's commit log, each user's directory and what is in
    /// it) are recognised, written plainly or through a symbolic link; nothing else is.
    #[test]
    fn our_own_names_in_dev_shm_are_recognised() {
        if !Path::new("/dev/shm").is_dir() {
            println!("SKIPPED: no /dev/shm");
            return;
        }
        for ours in [
            "/dev/shm/sqlite-bpe-0-2049-1234",
            "/dev/shm/sqlite-bpe-1000",
            "/dev/shm/sqlite-bpe-1000/x.bpe",
            "/dev/shm/./sqlite-bpe-7-1-2",
        ] {
            assert!(is_in_namespace(Path::new(ours)), "{ours}");
        }
        assert!(is_in_namespace(&directory().join("x.bpe")));
        for theirs in [
            "/dev/shm/x.bpe",
            "/dev/shm/sqlite-bp-1",
            "/dev/shm/other/sqlite-bpe-1",
            "/tmp/sqlite-bpe-demo-x/ext.bpe",
            "/var/sqlite-bpe-1",
        ] {
            assert!(!is_in_namespace(Path::new(theirs)), "{theirs}");
        }
        let tmp = tempfile::tempdir().unwrap();
        let link = tmp.path().join("shm");
        std::os::unix::fs::symlink("/dev/shm", &link).unwrap();
        assert!(is_in_namespace(&link.join("sqlite-bpe-0-1-2")));
        assert!(!is_in_namespace(&link.join("x.bpe")));
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
