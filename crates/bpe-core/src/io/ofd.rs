//! Open-file-description byte locks: the kernel drops them when the last descriptor of their
//! open file description closes, however the process ends (a SIGKILL included), so "is the
//! holder alive" is a lock probe, with no heartbeat to tune and no pid reuse to fear. Unlike
//! classic POSIX record locks they belong to the descriptor, not the process: closing another
//! descriptor of the same file does not drop them, and two descriptions in one process conflict
//! like two processes (which the tests use).

use std::fs::File;
use std::os::unix::io::AsRawFd;

fn request(kind: libc::c_int, byte: u64) -> libc::flock {
    // SAFETY: flock is plain data; zeroed is a valid value to fill in.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = byte as libc::off_t;
    fl.l_len = 1;
    fl
}

fn set(file: &File, cmd: libc::c_int, kind: libc::c_int, byte: u64) -> bool {
    let fl = request(kind, byte);
    loop {
        // SAFETY: the descriptor is open for the call (borrowed from `file`); fl is a valid flock.
        if unsafe { libc::fcntl(file.as_raw_fd(), cmd, &fl) } == 0 {
            return true;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return false;
        }
    }
}

/// Takes an exclusive lock on `byte` if no other description holds one; false otherwise.
pub fn try_exclusive(file: &File, byte: u64) -> bool {
    set(file, libc::F_OFD_SETLK, libc::F_WRLCK, byte)
}

/// Takes a shared lock on `byte` (or turns this description's exclusive one into a shared one)
/// unless another description holds it exclusively.
pub fn try_shared(file: &File, byte: u64) -> bool {
    set(file, libc::F_OFD_SETLK, libc::F_RDLCK, byte)
}

/// Takes an exclusive lock on `byte` if other holders release it (or die) within `wait`; false
/// otherwise (a holder stopped by SIGSTOP or a debugger keeps it as long as it is stopped).
pub fn exclusive_within(file: &File, byte: u64, wait: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + wait;
    let mut pause = std::time::Duration::from_micros(100);
    loop {
        if try_exclusive(file, byte) {
            return true;
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return false;
        }
        // The kernel has no timed wait for a record lock: look again, less often as it lasts.
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(std::time::Duration::from_millis(10));
    }
}

/// Releases this description's lock on `byte`, if it holds one.
pub fn release(file: &File, byte: u64) {
    set(file, libc::F_OFD_SETLK, libc::F_UNLCK, byte);
}

/// Whether another open file description (another process's, while it lives) holds any lock on
/// `byte`. A probe that fails answers "held": the caller then leaves things alone.
pub fn held_elsewhere(file: &File, byte: u64) -> bool {
    let mut fl = request(libc::F_WRLCK, byte);
    // SAFETY: the descriptor is open for the call; fl is a valid flock F_OFD_GETLK fills in.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) } != 0 {
        return true;
    }
    fl.l_type as libc::c_int != libc::F_UNLCK
}
