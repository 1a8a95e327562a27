//! A network volume's latency under the slow volume: `--data-device slowvol:gp3+1ms`.
//!
//! The blkio throttle caps the loop device's IOPS but adds no latency below the cap, so on this
//! machine's fast disk a "gp3" volume answers a read in tens of microseconds, at the fast disk's
//! own speed, where a real gp3 volume, a network device, takes about a millisecond. That is why the extension gained little on it: an L2 read
//! cost what a volume read cost. With a latency, the loop device's image is not a plain file on the
//! fast disk but the one file of a FUSE file system served by this module, which holds each
//! request (read, write, flush) for the latency before it serves it from the image on the fast
//! disk. Requests are served in parallel, one worker thread each (up to [`THREADS`]), as a network
//! volume serves them, so the latency does not cap the IOPS; the throttle on the loop device above
//! still does.
//!
//! The kernel never caches the file (`FOPEN_DIRECT_IO`), so every request the loop device makes
//! reaches a worker. The image's own writes are not synced to the fast disk: the volume is a
//! benchmark device, and a sync costs its latency, as a network volume's flush does.
//!
//! The server is its own process (the benchmark's binary, started with [`SERVE_ARG`]), so that a
//! volume kept with `--keep-volume` outlives the run; unmounting the FUSE file system ends it.

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, InitFlags,
    KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, WriteFlags,
};
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

/// The first argument that makes the benchmark's binary serve a latency volume instead.
pub const SERVE_ARG: &str = "__serve-latency-volume";

/// The name of the one file the FUSE file system holds.
pub const IMAGE_NAME: &str = "volume.img";

/// Requests served at once; a loop device keeps at most 128 in flight, SQLite's few threads far
/// fewer.
pub const THREADS: usize = 32;

const IMAGE_INODE: INodeNo = INodeNo(2);

/// The FUSE file system: a root directory holding [`IMAGE_NAME`].
struct LatencyFs {
    image: File,
    latency: Duration,
}

impl LatencyFs {
    fn attr(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        let (kind, size, perm, nlink) = match ino {
            INodeNo::ROOT => (FileType::Directory, 0, 0o755, 2),
            IMAGE_INODE => (
                FileType::RegularFile,
                self.image.metadata()?.len(),
                0o600,
                1,
            ),
            _ => return Err(Errno::ENOENT),
        };
        Ok(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        })
    }

    /// What the volume's network round trip costs each request.
    fn wait(&self) {
        std::thread::sleep(self.latency);
    }
}

/// Attributes are looked up again on every request: the image's size can change (setattr).
const TTL: Duration = Duration::ZERO;

impl Filesystem for LatencyFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // The loop device submits asynchronous direct I/O: let the kernel keep many in flight.
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        let _ = config.set_max_background(THREADS as u16);
        let _ = config.set_max_write(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent != INodeNo::ROOT || name != IMAGE_NAME {
            return reply.error(Errno::ENOENT);
        }
        match self.attr(IMAGE_INODE) {
            Ok(attr) => reply.entry(&TTL, &attr, fuser::Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if let (IMAGE_INODE, Some(size)) = (ino, size) {
            if let Err(e) = self.image.set_len(size) {
                return reply.error(e.into());
            }
        }
        match self.attr(ino) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino != IMAGE_INODE {
            return reply.error(Errno::EISDIR);
        }
        // No page cache for the image: every request reaches a worker and pays the latency.
        reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.wait();
        let mut buf = vec![0u8; size as usize];
        let mut filled = 0;
        while filled < buf.len() {
            match self
                .image
                .read_at(&mut buf[filled..], offset + filled as u64)
            {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return reply.error(e.into()),
            }
        }
        reply.data(&buf[..filled]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.wait();
        match self.image.write_all_at(data, offset) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e.into()),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // A close, not a sync: nothing to wait for.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.wait();
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
            (IMAGE_INODE, FileType::RegularFile, IMAGE_NAME),
        ];
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(ino, (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

/// Serves `image` as `<mount>/volume.img`, each request held for `latency`, until unmounted.
pub fn serve(image: &Path, mount: &Path, latency: Duration) -> anyhow::Result<()> {
    use anyhow::Context;
    let image = File::options()
        .read(true)
        .write(true)
        .open(image)
        .with_context(|| format!("opening the latency volume's image {}", image.display()))?;
    fuser::mount(LatencyFs { image, latency }, mount, &mount_config())
        .with_context(|| format!("serving the latency volume at {}", mount.display()))
}

/// [`THREADS`] workers, each reading requests from its own descriptor.
fn mount_config() -> fuser::Config {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName("bpe-latency-volume".into()),
        MountOption::RW,
    ];
    config.n_threads = Some(THREADS);
    config.clone_fd = true;
    config
}

/// The entry point behind [`SERVE_ARG`]: `IMAGE MOUNT LATENCY_US`. Returns None when `args` do
/// not start with it (the binary goes on as usual).
pub fn serve_if_asked(args: &[String]) -> Option<anyhow::Result<()>> {
    let rest = args.get(1..)?;
    if rest.first().map(String::as_str) != Some(SERVE_ARG) {
        return None;
    }
    Some((|| {
        let [_, image, mount, latency_us] = rest else {
            anyhow::bail!("usage: {SERVE_ARG} IMAGE MOUNT LATENCY_US");
        };
        let latency = Duration::from_micros(latency_us.parse()?);
        serve(&PathBuf::from(image), &PathBuf::from(mount), latency)
    })())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Root and /dev/fuse only: the mounted file reads and writes the image's bytes at any
    /// offset, and a truncation reaches the image.
    #[test]
    fn the_mounted_file_reads_and_writes_the_image() {
        // SAFETY: geteuid has no preconditions and touches no memory.
        if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
            eprintln!("skipped: needs root and /dev/fuse");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let image_path = dir.path().join("image");
        let pattern: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        std::fs::write(&image_path, &pattern).unwrap();
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        let image = File::options()
            .read(true)
            .write(true)
            .open(&image_path)
            .unwrap();
        let fs = LatencyFs {
            image,
            latency: Duration::from_micros(100),
        };
        let session = fuser::spawn_mount(fs, &mount, &mount_config()).unwrap();

        let names: Vec<_> = std::fs::read_dir(&mount)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [IMAGE_NAME]);
        let served = File::options()
            .read(true)
            .write(true)
            .open(mount.join(IMAGE_NAME))
            .unwrap();
        assert_eq!(served.metadata().unwrap().len(), 1 << 20);
        let mut buf = vec![0u8; 8192];
        served.read_exact_at(&mut buf, 12_345).unwrap();
        assert_eq!(buf, pattern[12_345..12_345 + 8192]);
        served
            .write_all_at(b"written through the mount", 500_000)
            .unwrap();
        served.sync_data().unwrap();
        served.set_len(600_000).unwrap();
        drop(served);
        drop(session);

        let after = std::fs::read(&image_path).unwrap();
        assert_eq!(after.len(), 600_000);
        assert_eq!(&after[500_000..500_025], b"written through the mount");
        assert_eq!(after[..500_000], pattern[..500_000]);
    }
}
