//! What a cached page is, read from SQLite's b-tree page header (file format, section 1.6).

/// Decoded facts about one page, for `bpe_buffer_descriptors`.
#[derive(Debug, PartialEq, Eq)]
pub struct PageInfo {
    pub page_type: &'static str,
    pub level: Option<i64>,
    pub row_count: Option<i64>,
    pub free_space: Option<i64>,
}

fn u16_at(b: &[u8], i: usize) -> usize {
    u16::from_be_bytes([b[i], b[i + 1]]) as usize
}

/// Decodes page `page_no` (SQLite numbering, from 1); page 1 starts with the 100-byte file header.
pub fn decode(page_no: u64, bytes: &[u8]) -> PageInfo {
    let hdr = if page_no == 1 { 100 } else { 0 };
    let unknown = PageInfo {
        page_type: "OVERFLOW_OR_FREELIST",
        level: None,
        row_count: None,
        free_space: None,
    };
    if bytes.len() < hdr + 12 {
        return unknown;
    }
    let (page_type, interior) = match bytes[hdr] {
        0x02 => ("INDEX_INTERIOR", true),
        0x05 => ("TABLE_INTERIOR", true),
        0x0a => ("INDEX_LEAF", false),
        0x0d => ("TABLE_LEAF", false),
        _ => return unknown,
    };
    let cells = u16_at(bytes, hdr + 3);
    let content = match u16_at(bytes, hdr + 5) {
        0 => 65536,
        n => n,
    };
    let fragmented = bytes[hdr + 7] as usize;
    let pointers_end = hdr + if interior { 12 } else { 8 } + 2 * cells;
    // Free blocks form a chain inside the cell content area; bound the walk by the page size.
    let mut free_blocks = 0;
    let mut next = u16_at(bytes, hdr + 1);
    let mut hops = 0;
    while next != 0 && next + 4 <= bytes.len() && hops < bytes.len() / 4 {
        free_blocks += u16_at(bytes, next + 2);
        next = u16_at(bytes, next);
        hops += 1;
    }
    let free = content.saturating_sub(pointers_end) + fragmented + free_blocks;
    PageInfo {
        page_type,
        level: (!interior).then_some(0),
        row_count: Some(cells as i64),
        free_space: Some(free as i64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_table_leaf_with_a_free_block() {
        let mut p = vec![0u8; 4096];
        p[0] = 0x0d;
        p[1..3].copy_from_slice(&3000u16.to_be_bytes()); // first free block
        p[3..5].copy_from_slice(&2u16.to_be_bytes()); // 2 cells
        p[5..7].copy_from_slice(&3000u16.to_be_bytes()); // content starts at 3000
        p[7] = 5; // fragmented bytes
        p[3000..3002].copy_from_slice(&0u16.to_be_bytes());
        p[3002..3004].copy_from_slice(&40u16.to_be_bytes());
        let info = decode(2, &p);
        assert_eq!(info.page_type, "TABLE_LEAF");
        assert_eq!(info.row_count, Some(2));
        assert_eq!(info.level, Some(0));
        assert_eq!(info.free_space, Some((3000 - (8 + 4)) + 5 + 40));
    }

    #[test]
    fn page_one_header_is_skipped_and_garbage_is_not_a_btree_page() {
        let mut p = vec![0u8; 1024];
        p[100] = 0x05;
        assert_eq!(decode(1, &p).page_type, "TABLE_INTERIOR");
        assert_eq!(decode(2, &p).page_type, "OVERFLOW_OR_FREELIST");
    }
}
