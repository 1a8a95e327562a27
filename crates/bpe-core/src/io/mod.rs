//! The I/O edge: aligned buffers, data files (O_DIRECT reads), the extension file, devices and
//! their wrappers (device emulation, fault injection). Unsafe code of the core lives here and
//! nowhere else.

pub mod aligned;
pub mod clock;
pub mod data_file;
pub mod device;
pub mod emulation;
pub mod extension_file;
pub mod faults;
pub mod own_file;
pub mod pid;

pub use aligned::AlignedBuf;
pub use data_file::{DataFile, FileIdentity, FileStamp};
pub use device::{DataDevice, FaultyExtensionFile, Instrumented};
pub use emulation::{DeviceCharges, DeviceOp, Emulator};
pub use faults::FaultInjector;
pub mod ofd;
pub mod posix_locks;
pub mod shared_memory;
pub mod shm_dir;
