//! The extension file's layout and its index checkpoints: what lets a new process start warm.
//!
//! ```text
//!   [ ring: regions x 512 KiB ][ checkpoint slot 0 ][ checkpoint slot 1 ][ unused, < 512 KiB ]
//! ```
//!
//! A checkpoint is the index as it stood at one moment: the data files whose cached pages it
//! vouches for (identity and stamp: size, mtime and ctime to the nanosecond), and where each of
//! their pages sits in the ring with its checksum, and whether it was in RAM too (hot). Checkpoints alternate between the two slots
//! (generation even: slot 0), each written whole with one O_DIRECT write; a slot whose header or
//! payload checksum fails, or whose geometry is not the file's, is not a checkpoint. The newest
//! valid slot wins, so a write torn by a crash leaves the previous one in force.
//!
//! Nothing here needs to be durable or fresh to be safe: every page is read back against its
//! checksum (a region the ring overwrote since is a miss), and a file's pages are used only when
//! the file's stamp now equals the one recorded (see `private/persist.rs`).
//!
//! A slot holds the entries of 4 KiB pages filling the ring (16 bytes per page: 0.4 % of the
//! ring per slot); when smaller pages need more, the newest regions' entries are kept.

use super::{ExtensionIndex, REGION_BYTES, UNIT};
use crate::io::{AlignedBuf, FileIdentity, FileStamp};

const MAGIC: &[u8; 8] = b"BPECKPT1";
/// 2: each file carries its first page's checksum (a checkpoint of format 1 starts cold).
const VERSION: u32 = 2;
const HEADER_BYTES: usize = 4096;
/// Bytes of the header the header checksum covers (the checksum follows them).
const HEADER_USED: usize = 60;
const FILE_BYTES: usize = 48;
const ENTRY_BYTES: usize = 16;
/// Data files one checkpoint vouches for, at most.
pub const MAX_FILES: usize = 1024;
/// Entries per region a slot has room for: the region filled with 4 KiB pages.
const ENTRIES_PER_REGION: usize = (REGION_BYTES / 4096) as usize;

/// Bytes of one checkpoint slot for a ring of `regions` regions.
pub const fn slot_bytes(regions: usize) -> u64 {
    let payload = MAX_FILES * FILE_BYTES + regions * ENTRIES_PER_REGION * ENTRY_BYTES;
    (HEADER_BYTES + payload.div_ceil(HEADER_BYTES) * HEADER_BYTES) as u64
}

/// Bytes of an extension file whose ring has `regions` regions.
pub const fn file_bytes(regions: usize) -> u64 {
    regions as u64 * REGION_BYTES + 2 * slot_bytes(regions)
}

/// Regions of the largest ring that fits in `size` bytes with its slots (0 if none does).
pub fn regions_for(size: u64) -> usize {
    let cap = (u32::MAX as u64 / 1024) as usize;
    let mut r = ((size / REGION_BYTES) as usize).min(cap);
    while r > 0 && file_bytes(r) > size {
        r -= 1;
    }
    r
}

/// Where slot `i` starts in a file whose ring has `regions` regions.
pub fn slot_offset(regions: usize, i: u64) -> u64 {
    regions as u64 * REGION_BYTES + (i % 2) * slot_bytes(regions)
}

/// One data file a checkpoint vouches for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SavedFile {
    pub stamp: FileStamp,
    /// The file's first page as RAM held it when the stamp was vouched for: adoption reads the
    /// first page again and compares, so that a stamp alone never vouches for a file (a write
    /// within a coarse clock tick can leave size and times as they were; the first page of a
    /// database carries the change counter of every commit).
    pub first_page: Option<PageCheck>,
}

pub use crate::page::PageCheck;

/// One cached page: which file (an index into the checkpoint's files), where, and its checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SavedEntry {
    pub file: u16,
    pub page: u32,
    pub crc: u32,
    pub region: u32,
    /// Offset within the region, in UNITs.
    pub unit: u16,
    pub size_log2: u8,
    /// The page was also in RAM when the checkpoint was taken (the hot set).
    pub hot: bool,
}

impl SavedEntry {
    pub fn offset_in_region(&self) -> usize {
        self.unit as usize * UNIT
    }
    pub fn len(&self) -> usize {
        1 << self.size_log2
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checkpoint {
    pub generation: u64,
    /// The region the writer enters next: the oldest of the ring.
    pub next_region: usize,
    pub files: Vec<SavedFile>,
    pub entries: Vec<SavedEntry>,
}

/// Regions the writer may enter after the checkpoint in force before it writes another, and
/// that a restore therefore treats as overwritten from the checkpoint's `next_region` on: after
/// a kill, the entries listed for those regions may point at other pages' bytes, and a 32-bit
/// checksum alone must not be what stands between such an entry and a reader. A sixteenth of
/// the ring (its oldest pages, the next to go anyway), so that checkpoints cost at most one
/// sixteenth more writes (16 bytes per 4 KiB page listed, per sixteenth of the ring written).
pub const fn unlisted_regions(regions: usize) -> usize {
    let m = regions / 16;
    if m == 0 {
        1
    } else {
        m
    }
}

/// Entries a slot has room for.
pub fn entry_capacity(regions: usize) -> usize {
    regions * ENTRIES_PER_REGION
}

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Checkpoint {
    /// The slot's bytes (header and payload), ready for one aligned write. The caller keeps
    /// `files` and `entries` within [`MAX_FILES`] and [`entry_capacity`].
    pub fn encode(&self, regions: usize) -> AlignedBuf {
        assert!(self.files.len() <= MAX_FILES && self.entries.len() <= entry_capacity(regions));
        let payload_len = self.files.len() * FILE_BYTES + self.entries.len() * ENTRY_BYTES;
        let mut buf = AlignedBuf::new(HEADER_BYTES + payload_len);
        let p = &mut buf[HEADER_BYTES..];
        let mut at = 0;
        for f in &self.files {
            let s = &f.stamp;
            put(p, at, &s.identity.dev.to_le_bytes());
            put(p, at + 8, &s.identity.ino.to_le_bytes());
            put(p, at + 16, &s.size.to_le_bytes());
            put(p, at + 24, &s.mtime_ns.to_le_bytes());
            put(p, at + 32, &s.ctime_ns.to_le_bytes());
            // Length 0: no first page recorded.
            let check = f.first_page.unwrap_or(PageCheck { len: 0, crc: 0 });
            put(p, at + 40, &check.len.to_le_bytes());
            put(p, at + 44, &check.crc.to_le_bytes());
            at += FILE_BYTES;
        }
        for e in &self.entries {
            put(p, at, &e.page.to_le_bytes());
            put(p, at + 4, &e.crc.to_le_bytes());
            put(p, at + 8, &e.region.to_le_bytes());
            let place = e.unit | ((e.size_log2 as u16 - 9) << 11) | ((e.hot as u16) << 15);
            put(p, at + 12, &place.to_le_bytes());
            put(p, at + 14, &e.file.to_le_bytes());
            at += ENTRY_BYTES;
        }
        let payload_crc = crc32c::crc32c(&buf[HEADER_BYTES..HEADER_BYTES + payload_len]);
        let h = &mut buf[..HEADER_BYTES];
        put(h, 0, MAGIC);
        put(h, 8, &VERSION.to_le_bytes());
        put(h, 12, &(HEADER_BYTES as u32).to_le_bytes());
        put(h, 16, &self.generation.to_le_bytes());
        put(h, 24, &REGION_BYTES.to_le_bytes());
        put(h, 32, &(regions as u64).to_le_bytes());
        put(h, 40, &(self.next_region as u64).to_le_bytes());
        put(h, 48, &(self.files.len() as u32).to_le_bytes());
        put(h, 52, &(self.entries.len() as u32).to_le_bytes());
        put(h, 56, &payload_crc.to_le_bytes());
        let header_crc = crc32c::crc32c(&h[..HEADER_USED]);
        put(h, HEADER_USED, &header_crc.to_le_bytes());
        buf
    }

    /// The generation and payload length of a slot header, if it is a valid header of a
    /// checkpoint of a ring of `regions` regions.
    pub fn header(h: &[u8], regions: usize) -> Result<(u64, usize), String> {
        if h.len() < HEADER_BYTES || &h[..8] != MAGIC {
            return Err("no checkpoint".into());
        }
        if crc32c::crc32c(&h[..HEADER_USED]) != u32_at(h, HEADER_USED) {
            return Err("the checkpoint header fails its checksum".into());
        }
        if u32_at(h, 8) != VERSION || u32_at(h, 12) as usize != HEADER_BYTES {
            return Err(format!("checkpoint format {} is not ours", u32_at(h, 8)));
        }
        if u64_at(h, 24) != REGION_BYTES || u64_at(h, 32) != regions as u64 {
            return Err("the checkpoint is of a ring of another size".into());
        }
        let (files, entries) = (u32_at(h, 48) as usize, u32_at(h, 52) as usize);
        if files > MAX_FILES || entries > entry_capacity(regions) {
            return Err("the checkpoint claims more than a slot holds".into());
        }
        Ok((u64_at(h, 16), files * FILE_BYTES + entries * ENTRY_BYTES))
    }

    /// Decodes a whole slot (header and payload), checking everything it claims.
    pub fn decode(slot: &[u8], regions: usize) -> Result<Checkpoint, String> {
        let (generation, payload_len) = Self::header(slot, regions)?;
        let h = &slot[..HEADER_BYTES];
        let p = slot
            .get(HEADER_BYTES..HEADER_BYTES + payload_len)
            .ok_or("the checkpoint is cut short")?;
        if crc32c::crc32c(p) != u32_at(h, 56) {
            return Err("the checkpoint payload fails its checksum".into());
        }
        let next_region = u64_at(h, 40) as usize;
        if next_region >= regions {
            return Err("the checkpoint's ring position is outside the ring".into());
        }
        let n_files = u32_at(h, 48) as usize;
        let files = (0..n_files)
            .map(|i| {
                let b = &p[i * FILE_BYTES..];
                SavedFile {
                    stamp: FileStamp {
                        identity: FileIdentity {
                            dev: u64_at(b, 0),
                            ino: u64_at(b, 8),
                        },
                        size: u64_at(b, 16),
                        mtime_ns: u64_at(b, 24) as i64,
                        ctime_ns: u64_at(b, 32) as i64,
                    },
                    first_page: Some(PageCheck {
                        len: u32_at(b, 40),
                        crc: u32_at(b, 44),
                    })
                    .filter(|c| c.len > 0),
                }
            })
            .collect();
        let mut entries = Vec::with_capacity(u32_at(h, 52) as usize);
        for b in p[n_files * FILE_BYTES..].chunks_exact(ENTRY_BYTES) {
            let place = u16_at(b, 12);
            let e = SavedEntry {
                page: u32_at(b, 0),
                crc: u32_at(b, 4),
                region: u32_at(b, 8),
                unit: place & 0x7ff,
                size_log2: ((place >> 11) & 7) as u8 + 9,
                hot: place >> 15 == 1,
                file: u16_at(b, 14),
            };
            let fits = e.size_log2 <= 16
                && (e.region as usize) < regions
                && (e.file as usize) < n_files
                && e.offset_in_region() + e.len() <= REGION_BYTES as usize
                && ExtensionIndex::fits(crate::page::PageKey::new(1, e.page as u64));
            if !fits {
                return Err("a checkpoint entry lies outside the ring".into());
            }
            entries.push(e);
        }
        Ok(Checkpoint {
            generation,
            next_region,
            files,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        let stamp = |ino| FileStamp {
            identity: FileIdentity { dev: 3, ino },
            size: 1 << 20,
            mtime_ns: 1_700_000_000_123_456_789,
            ctime_ns: 1_700_000_000_223_456_789,
        };
        Checkpoint {
            generation: 7,
            next_region: 2,
            files: vec![
                SavedFile {
                    stamp: stamp(10),
                    first_page: Some(PageCheck {
                        len: 4096,
                        crc: 0xdead_beef,
                    }),
                },
                SavedFile {
                    stamp: stamp(11),
                    first_page: None,
                },
            ],
            entries: vec![
                SavedEntry {
                    file: 0,
                    page: 5,
                    crc: 0xdead_beef,
                    region: 1,
                    unit: 8,
                    size_log2: 12,
                    hot: true,
                },
                SavedEntry {
                    file: 1,
                    page: 0,
                    crc: 1,
                    region: 3,
                    unit: 1023,
                    size_log2: 9,
                    hot: false,
                },
                SavedEntry {
                    file: 1,
                    page: 9,
                    crc: 2,
                    region: 0,
                    unit: 896,
                    size_log2: 16,
                    hot: true,
                },
            ],
        }
    }

    #[test]
    fn a_checkpoint_reads_back_as_written() {
        let c = sample();
        let buf = c.encode(4);
        assert_eq!(Checkpoint::decode(&buf, 4), Ok(c));
    }

    #[test]
    fn a_damaged_or_foreign_slot_is_not_a_checkpoint() {
        let buf = sample().encode(4);
        assert!(Checkpoint::decode(&buf, 5).is_err(), "another ring size");
        assert!(
            Checkpoint::decode(&vec![0u8; buf.len()], 4).is_err(),
            "zeros"
        );
        for at in [
            0,
            17,
            44,
            HEADER_BYTES + 3,
            HEADER_BYTES + 2 * FILE_BYTES + 20,
        ] {
            let mut bad = buf.to_vec();
            bad[at] ^= 1;
            assert!(Checkpoint::decode(&bad, 4).is_err(), "bit flipped at {at}");
        }
        assert!(
            Checkpoint::decode(&buf[..HEADER_BYTES + 10], 4).is_err(),
            "cut short"
        );
    }

    #[test]
    fn the_file_fits_the_size_asked_for_and_slots_hold_a_ring_of_4_kib_pages() {
        for size in [3 << 20, 64 << 20, 1 << 30, (1 << 30) + 12345] {
            let r = regions_for(size);
            assert!(file_bytes(r) <= size && file_bytes(r + 1) > size, "{size}");
            let ring = r as u64 * REGION_BYTES;
            assert!(
                2 * slot_bytes(r) < ring / 50 + (1 << 20),
                "slots of {size} too big"
            );
            assert_eq!(entry_capacity(r) as u64, ring / 4096);
        }
        assert_eq!(regions_for(REGION_BYTES), 0);
    }
}
