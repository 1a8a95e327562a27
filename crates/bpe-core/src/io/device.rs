//! Devices: what the engine reads a missed page from and writes a page to. The data file's own
//! descriptors are one; a caller may bring another (the SQLite adapter routes page I/O through
//! SQLite's own file methods where O_DIRECT is not used, so that SQLite's I/O hooks see it).
//! Emulation of a slow device and fault injection wrap whichever device is used.

use super::emulation::DeviceOp;
use super::extension_file::ExtensionFile;
use super::{Emulator, FaultInjector};
use std::sync::Arc;

/// Positional I/O on one data file.
pub trait DataDevice {
    /// Reads `buf.len()` bytes at `offset`; returns how many existed before end of file (the rest
    /// of `buf` is zero-filled).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize>;
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()>;
}

/// A device with emulated costs (reads and writes) and injected faults in front of it (benchmarks and tests;
/// unused, it costs one relaxed atomic load per request).
pub struct Instrumented<'a> {
    pub inner: &'a dyn DataDevice,
    pub emulator: Option<&'a Emulator>,
    pub faults: &'a FaultInjector,
}

impl DataDevice for Instrumented<'_> {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(e) = self.faults.take_data_read_error() {
            return Err(e);
        }
        if let Some(emu) = self.emulator {
            emu.charge(DeviceOp::Read(buf.len() as u64));
        }
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        if let Some(emu) = self.emulator {
            emu.charge(DeviceOp::Write(data.len() as u64));
        }
        self.inner.write_at(offset, data)
    }
}

/// The extension file with fault injection in front (tests make it fail or lie; unused, one
/// relaxed atomic load per request). The file itself holds no test hook.
pub struct FaultyExtensionFile {
    file: ExtensionFile,
    faults: Arc<FaultInjector>,
}

impl FaultyExtensionFile {
    pub fn new(file: ExtensionFile, faults: Arc<FaultInjector>) -> Self {
        FaultyExtensionFile { file, faults }
    }

    /// The file underneath (path, identity, removal).
    pub fn file(&self) -> &ExtensionFile {
        &self.file
    }

    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        if let Some(e) = self.faults.take_extension_read_error() {
            return Err(e);
        }
        self.file.read_at(offset, buf)?;
        if self.faults.take_extension_corruption() {
            buf.iter_mut().step_by(97).for_each(|b| *b ^= 0x5a);
        }
        Ok(())
    }

    pub fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        if let Some(e) = self.faults.take_extension_write_error() {
            return Err(e);
        }
        self.file.write_at(offset, data)
    }
}
