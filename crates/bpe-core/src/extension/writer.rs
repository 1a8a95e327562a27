//! The extension's background writer: the only thread that writes the extension file.
//!
//! It gathers staged pages into a batch, frees the ring slots the batch will overwrite (the
//! oldest), writes the batch with one large O_DIRECT write at the ring's head, and only then
//! indexes the pages whose staging entry is still current (a write to a page in between has
//! removed it). Queries never wait for it.

use super::{Extension, Staged};
use crate::counters::Counters;
use crate::io::AlignedBuf;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// How long the writer waits for more pages before writing a partial batch.
const GATHER: Duration = Duration::from_millis(2);
const POLL: Duration = Duration::from_millis(50);

/// Starts the writer. The receiver it returns yields once, when the writer has stopped.
pub(super) fn spawn(ext: Arc<Extension>, rx: Receiver<Staged>) -> Receiver<()> {
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    // Detached: shutdown waits for `done` (with a deadline) rather than joining, so that an
    // operator's OFF or resize can never hang on the thread's exit.
    std::thread::Builder::new()
        .name("bpe-extension-writer".into())
        .spawn(move || {
            Writer::new(ext).run(rx);
            let _ = done_tx.send(());
        })
        .expect("spawn extension writer");
    done_rx
}

struct Writer {
    ext: Arc<Extension>,
    head: u32,
    /// Byte offset where the previous batch ended, to count sequential writes.
    last_end: Option<u64>,
    buf: AlignedBuf,
    batch_slots: usize,
}

impl Writer {
    fn new(ext: Arc<Extension>) -> Self {
        let batch_slots = (ext.slots_per_region as usize)
            .min(ext.slots as usize)
            .max(1);
        let buf = AlignedBuf::new(batch_slots * ext.slot_size);
        Writer {
            ext,
            head: 0,
            last_end: None,
            buf,
            batch_slots,
        }
    }

    fn run(mut self, rx: Receiver<Staged>) {
        let mut batch: Vec<Staged> = Vec::with_capacity(self.batch_slots);
        loop {
            if self.ext.stopping.load(Relaxed) {
                return;
            }
            if batch.is_empty() {
                match rx.recv_timeout(POLL) {
                    Ok(s) => batch.push(s),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            // Never write past the end of the ring: a batch ends there and the next starts at 0.
            let room = (self.ext.slots - self.head) as usize;
            let limit = self.batch_slots.min(room);
            while batch.len() < limit {
                match rx.recv_timeout(GATHER) {
                    Ok(s) => batch.push(s),
                    Err(_) => break,
                }
            }
            let rest = if batch.len() > limit {
                batch.split_off(limit)
            } else {
                Vec::new()
            };
            self.write_batch(&batch);
            batch = rest;
        }
    }

    fn write_batch(&mut self, batch: &[Staged]) {
        let ext = &self.ext;
        let slot_size = ext.slot_size;
        let n = batch.len() as u32;
        let first = self.head;
        self.evict_slots(first, n);

        let mut crcs = Vec::with_capacity(batch.len());
        for (i, s) in batch.iter().enumerate() {
            let dst = &mut self.buf[i * slot_size..(i + 1) * slot_size];
            let page = &s.frame.data;
            dst[..page.len()].copy_from_slice(page);
            dst[page.len()..].fill(0);
            crcs.push(crc32c::crc32c(page));
        }
        let offset = first as u64 * slot_size as u64;
        let bytes = batch.len() * slot_size;
        ext.counters.ext_outstanding_io.fetch_add(1, Relaxed);
        let res = ext.file.write_at(offset, &self.buf[..bytes]);
        ext.counters.ext_outstanding_io.fetch_sub(1, Relaxed);
        self.head = (first + n) % ext.slots;

        let mut t = ext.tables.write();
        if let Err(e) = res {
            for s in batch {
                if t.staged.get(&s.key) == Some(&s.seq) {
                    t.staged.remove(&s.key);
                }
            }
            drop(t);
            Counters::bump(&ext.counters.ext_io_errors);
            ext.fault(format!("write error: {e}"));
            self.last_end = None;
            return;
        }
        for (i, s) in batch.iter().enumerate() {
            if t.staged.get(&s.key) == Some(&s.seq) {
                t.staged.remove(&s.key);
                t.index.insert(s.key, first + i as u32, crcs[i]);
            }
        }
        drop(t);
        // Faults must be consecutive to disable the extension: a good write ends a streak.
        ext.consecutive_faults.store(0, Relaxed);
        let c = &ext.counters;
        c.ext_page_writes.fetch_add(n as u64, Relaxed);
        c.ext_bytes_written.fetch_add(bytes as u64, Relaxed);
        if self.last_end.is_none_or(|end| end == offset) {
            c.ext_sequential_write_pages.fetch_add(n as u64, Relaxed);
        }
        self.last_end = Some((offset + bytes as u64) % ext.size_bytes());
    }

    /// Frees slots [first, first + n) before they are overwritten.
    fn evict_slots(&self, first: u32, n: u32) {
        let ext = &self.ext;
        let now = ext.now_ms();
        let mut t = ext.tables.write();
        for slot in first..first + n {
            if t.index.clear_slot(slot).is_some() {
                Counters::bump(&ext.counters.ext_page_evictions);
                let last =
                    ext.region_last_ref[(slot / ext.slots_per_region) as usize].load(Relaxed);
                Counters::average_in(&ext.counters.ext_unreferenced_ms, now.saturating_sub(last));
            }
        }
        // A fresh region: its pages have not been referenced since they were written.
        ext.region_last_ref[(first / ext.slots_per_region) as usize].store(now, Relaxed);
    }
}
