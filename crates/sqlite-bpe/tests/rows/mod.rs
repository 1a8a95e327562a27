//! Self-checking rows for the fault and crash tests: every row carries a checksum of its payload,
//! so every read of it can be verified, whichever tier its page came from.
#![allow(dead_code)]

/// CRC-32 (IEEE), bitwise: small and dependency-free; speed does not matter here.
pub fn crc32(data: &[u8]) -> i64 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    (!crc) as i64
}

/// Deterministic pseudo-random bytes from `seed` (xorshift64*): the expected payload of a row.
pub fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}
