//! Whether this process holds POSIX record locks on a file, from `/proc/locks`.
//!
//! Closing *any* descriptor of a file drops every POSIX lock the process holds on it, whoever
//! took them (fcntl(2)). SQLite's unix VFS guards its own connections against that (it keeps a
//! closed descriptor open while the inode has locks), but it cannot see our descriptors: a
//! connection of another VFS in this process (a plain writer beside bpe readers, as rqlite
//! runs) would silently lose its locks when bpe closes the file. So a data file's descriptors
//! are closed only once the process holds no POSIX lock on the inode (see `files.rs`).

use super::FileIdentity;

/// Whether this process holds a POSIX lock on the file. If `/proc/locks` cannot be read or
/// parsed, true: keeping a descriptor open costs a descriptor, closing it may cost data.
pub fn held_by_this_process(file: FileIdentity) -> bool {
    match std::fs::read_to_string("/proc/locks") {
        Ok(table) => held_in(&table, std::process::id(), file).unwrap_or(true),
        Err(_) => true,
    }
}

/// `held_by_this_process` over a `/proc/locks` text; None if a line cannot be read.
fn held_in(table: &str, pid: u32, file: FileIdentity) -> Option<bool> {
    let (major, minor) = (
        libc::major(file.dev as libc::dev_t),
        libc::minor(file.dev as libc::dev_t),
    );
    for line in table.lines() {
        // "12: POSIX  ADVISORY  WRITE 4242 fd:01:1311 1073741824 1073741824", and for a
        // waiter "12: -> POSIX ...": the waiter holds nothing.
        let mut fields = line.split_whitespace().skip(1);
        let kind = fields.next()?;
        if kind != "POSIX" {
            continue;
        }
        let (_, _, owner, inode) = (
            fields.next()?,
            fields.next()?,
            fields.next()?,
            fields.next()?,
        );
        if owner.parse::<u32>().ok() != Some(pid) {
            continue;
        }
        let mut parts = inode.split(':');
        let (maj, min, ino) = (parts.next()?, parts.next()?, parts.next()?);
        let same = u32::from_str_radix(maj, 16).ok()? == major
            && u32::from_str_radix(min, 16).ok()? == minor
            && ino.parse::<u64>().ok()? == file.ino;
        if same {
            return Some(true);
        }
    }
    Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_table_is_read_for_this_process_and_this_inode() {
        let dev = libc::makedev(0xfd, 1) as u64;
        let file = FileIdentity { dev, ino: 1311 };
        let table = "1: POSIX  ADVISORY  WRITE 4242 fd:01:1311 1073741824 1073741824\n\
                     2: -> POSIX  ADVISORY  WRITE 7 fd:01:1311 0 EOF\n\
                     3: OFDLCK ADVISORY  READ  -1 fd:01:1311 0 0\n\
                     4: FLOCK  ADVISORY  WRITE 7 fd:01:1311 0 EOF\n\
                     5: POSIX  ADVISORY  READ  7 fd:01:99 0 EOF\n";
        assert_eq!(held_in(table, 4242, file), Some(true));
        assert_eq!(
            held_in(table, 7, file),
            Some(false),
            "waiters, flock, other inodes"
        );
        assert_eq!(
            held_in(table, 4242, FileIdentity { dev, ino: 99 }),
            Some(false)
        );
        assert_eq!(held_in("1: POSIX ADVISORY\n", 4242, file), None);
    }

    #[test]
    fn a_lock_this_process_takes_is_seen_and_its_release_too() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("locked");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let id = FileIdentity::of_file(&f).unwrap();
        assert!(!held_by_this_process(id));
        let set = |kind: libc::c_int| {
            // SAFETY: flock is plain data; all zeroes is a valid value.
            let mut lock: libc::flock = unsafe { std::mem::zeroed() };
            lock.l_type = kind as _;
            lock.l_whence = libc::SEEK_SET as _;
            lock.l_start = 100;
            lock.l_len = 1;
            // SAFETY: a valid open descriptor and a filled-in flock that outlives the call.
            let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &lock) };
            assert_eq!(rc, 0);
        };
        set(libc::F_WRLCK);
        assert!(held_by_this_process(id));
        set(libc::F_UNLCK);
        assert!(!held_by_this_process(id));
    }
}
