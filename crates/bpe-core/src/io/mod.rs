//! The I/O edge: aligned buffers, O_DIRECT data files, device emulation and fault injection.
//! Unsafe code of the core lives here and nowhere else.

pub mod aligned;
pub mod data_file;
pub mod emulation;
pub mod extension_file;
pub mod faults;

pub use aligned::AlignedBuf;
pub use data_file::{DataFile, FileIdentity};
pub use emulation::Emulator;
pub use faults::FaultInjector;
