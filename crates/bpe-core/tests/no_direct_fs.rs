//! On a file system that refuses O_DIRECT (ramfs): data files fall back to buffered reads and say
//! so; the extension is refused with a named reason and no file left behind. Mounting needs root
//! (CI runs as root); elsewhere the test says it did not run.

mod common;
use common::*;
use std::path::PathBuf;
use std::process::Command;

struct Ramfs(PathBuf);

impl Ramfs {
    fn mount() -> Option<Ramfs> {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("ramfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "ramfs", "none"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Ramfs(dir))
    }
}

impl Drop for Ramfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn data_files_fall_back_visibly_and_the_extension_is_refused() {
    let Some(fs) = Ramfs::mount() else {
        eprintln!("SKIPPED: cannot mount ramfs here (needs root)");
        return;
    };
    let path = make_file(&fs.0, "data", 32, PAGE);
    let engine = engine(1 << 20);
    let f = engine.open_file(&path, PAGE).unwrap();
    assert!(!engine.files()[0].direct_io);
    assert_eq!(engine.counters().buffered_data_files, 1);
    for p in 0..32 {
        assert_eq!(decode(&read(&engine, &f, p).0), Some((p, 0)));
    }
    engine.write_page(&f, 3, &page_bytes(3, 1, PAGE)).unwrap();
    engine.drop_clean_buffers();
    assert_eq!(decode(&read(&engine, &f, 3).0), Some((3, 1)));

    let ext = fs.0.join("ext.bpe");
    let err = engine
        .enable_extension(&ext, 8 << 20)
        .unwrap_err()
        .to_string();
    assert!(err.contains("O_DIRECT"), "{err}");
    assert!(!ext.exists(), "a refused extension left its file");
    engine.close_file(&f);
}
