//! Where a page goes. Read: L1 (RAM), then L2 (the extension), then the data file, and the copy
//! that was found is installed in L1. Write: the data file first, then the clean copy in L1; the
//! L2 copy is dropped before the data file is touched, so L2 can never serve a stale page.
//!
//! Staleness and tearing are ruled out by the pool's per-page pending entries: a load installs
//! its bytes only if no write to the page started while it was reading, and readers of a page
//! being written wait for the write, so every read returns bytes of a completed write.

use super::Engine;
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::extension::shared::SharedRead;
use crate::extension::Extension;
use crate::files::FileHandle;
use crate::io::{DataDevice, DeviceCharges, DeviceOp, Instrumented};
use crate::page::{PageKey, Tier};
use crate::pool::{Frame, LoadSource, Lookup, NewFrame, Ticket};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

/// The outcome of a page read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRead {
    /// Where the bytes came from.
    pub tier: Tier,
    /// Bytes that exist in the file; less than the page size at end of file (the rest is zeros
    /// and nothing was cached).
    pub len: usize,
}

/// A page held in place in L1 (see `Engine::pin_cached`).
pub struct PinnedPage(Arc<Frame>);

impl PinnedPage {
    pub fn bytes(&self) -> &[u8] {
        &self.0.data
    }
}

/// How a read or write reaches the data file: the caller's device, if it brings one (SQLite's
/// own file methods), else the file's own descriptors. Reads prefer the O_DIRECT descriptor
/// whatever the caller brings, so that the OS page cache never stands in for the tiers.
#[derive(Clone, Copy)]
pub struct Via<'a>(pub Option<&'a dyn DataDevice>);

/// Where [`Engine::fetch`] found a missed page.
enum Found {
    /// In L2, this file's own copy.
    Extension,
    /// In an earlier snapshot's cache, of this tier.
    Lineage(Tier),
    /// In the data file: the bytes the file had (less than a page past end of file), and the
    /// pages a readahead brought with it.
    DataFile(usize, Option<ReadAhead>),
}

/// Pages a data-file readahead read, to install (after the page asked for, if it read one).
struct ReadAhead {
    /// The whole request: `skip` pages not to install (the page asked for, which its reader
    /// installs), then one page per ticket.
    chunk: Vec<u8>,
    skip: usize,
    /// Bytes of `chunk` that the file had.
    got: usize,
    tickets: Vec<Option<Ticket>>,
    /// Per ticket, what its read was made under (a shared extension; see `Engine::read_under`).
    shared: Vec<Option<SharedRead>>,
    started: Instant,
}

impl Engine {
    /// Reads page `page` of `file` into `buf` (exactly one page).
    pub fn read_page(&self, file: &FileHandle, page: u64, buf: &mut [u8]) -> Result<PageRead> {
        self.read_page_via(file, page, buf, Via(None))
    }

    /// Reads page `page` of `file` into `buf`, reaching the data file through `via` on a miss.
    pub fn read_page_via(
        &self,
        file: &FileHandle,
        page: u64,
        buf: &mut [u8],
        via: Via<'_>,
    ) -> Result<PageRead> {
        let page_size = file.page_size();
        if buf.len() != page_size {
            return Err(Error::BufferSize {
                got: buf.len(),
                page_size,
            });
        }
        let key = PageKey::new(file.key(), page);
        self.counters.page_lookups.bump();
        self.trace.record(key);
        if self.pool.copy_if_resident(key, buf, self.now_ms()) {
            return Ok(self.served_from_memory(file, key, page_size));
        }
        loop {
            match self.pool.lookup(key) {
                Lookup::Hit(frame) => {
                    // It became resident since `copy_if_resident` looked.
                    frame.touch(self.now_ms());
                    buf.copy_from_slice(&frame.data);
                    return Ok(self.served_from_memory(file, key, page_size));
                }
                Lookup::Wait(pending) => pending.wait(),
                Lookup::Load(ticket) => {
                    if let Some(read) = self.load(file, ticket, buf, via)? {
                        return Ok(read);
                    }
                    // A write to this page started while we read it: read it again.
                }
            }
        }
    }

    /// The bookkeeping of an L1 hit, once its bytes are copied.
    fn served_from_memory(&self, file: &FileHandle, key: PageKey, page_size: usize) -> PageRead {
        self.counters.l1_hits.bump();
        if self.config.readahead {
            self.read_ahead_on_hit(file, key);
        }
        PageRead {
            tier: Tier::Memory,
            len: page_size,
        }
    }

    /// The page's bytes in place, if L1 holds them: no copy, no load (SQLite's memory-mapped
    /// reads, `xFetch`). The bytes stay valid and unchanged while the pin lives (a frame's bytes
    /// never change; a write or a forget replaces the frame, and its slot is freed only when the
    /// last pin drops). A miss returns None and the caller reads the page the usual way.
    pub fn pin_cached(&self, file: &FileHandle, page: u64) -> Option<PinnedPage> {
        let key = PageKey::new(file.key(), page);
        let frame = self.pool.peek(key)?;
        if frame.data.len() != file.page_size() {
            return None;
        }
        self.counters.page_lookups.bump();
        self.counters.l1_hits.bump();
        frame.touch(self.now_ms());
        if self.config.readahead {
            self.read_ahead_on_hit(file, key);
        }
        Some(PinnedPage(frame))
    }

    /// Fetches a missed page from L2 or the data file. None if a racing write voided the read.
    ///
    /// The page is read straight into the L1 slot it will be installed in, reserved first
    /// ([`BufferPool::reserve_load`]), and copied from there into `buf`: one copy of the page
    /// instead of two (device to `buf`, `buf` to the slot). The slot stays invisible until
    /// [`BufferPool::finish_load_in`] installs it, which it does only as `finish_load` would (no
    /// write started during the read); a read that fails or is not cached drops it, returning
    /// its memory. When L1 has no room for a slot, the page is read into `buf` and installed
    /// from there as before.
    ///
    /// [`BufferPool::reserve_load`]: crate::pool::BufferPool::reserve_load
    /// [`BufferPool::finish_load_in`]: crate::pool::BufferPool::finish_load_in
    fn load(
        &self,
        file: &FileHandle,
        ticket: Ticket,
        buf: &mut [u8],
        via: Via<'_>,
    ) -> Result<Option<PageRead>> {
        let started = Instant::now();
        let key = ticket.key;
        let ext = self.current_extension();
        // Before either read: see `Engine::read_under`.
        let shared = ext.as_ref().and_then(|e| e.read_under(file, key));
        let mut slot = self.pool.reserve_load(buf.len(), self);
        let found = match slot.as_mut() {
            Some(slot) => self.fetch(file, key, slot.bytes_mut(), ext.as_ref(), via),
            None => self.fetch(file, key, buf, ext.as_ref(), via),
        };
        let l2_hit = matches!(found, Ok(Found::Extension));
        let (tier, len, ahead) = match found {
            Ok(Found::Extension) => (Tier::Extension, buf.len(), None),
            Ok(Found::Lineage(tier)) => (tier, buf.len(), None),
            Ok(Found::DataFile(len, ahead)) => (Tier::DataFile, len, ahead),
            Err(e) => {
                drop(slot); // before the ticket ends: nothing half-read is ever installed
                self.pool.abort(ticket);
                return Err(e);
            }
        };
        if let Some(slot) = &slot {
            buf.copy_from_slice(slot.bytes());
        }
        let read = PageRead { tier, len };
        if len < buf.len() {
            // Past end of file: report it, cache nothing.
            drop(slot);
            self.pool.abort(ticket);
            if let Some(ahead) = ahead {
                self.install_read_ahead(file, ahead);
            }
            return Ok(Some(read));
        }
        let source = match tier {
            Tier::DataFile => LoadSource::DataFile,
            _ => LoadSource::Extension,
        };
        let installed = if source == LoadSource::DataFile && file.rewrites.churning(self.now_ms()) {
            // Served, not cached: see `RewriteWatch::churning`.
            drop(slot);
            self.pool.finish_uncached(ticket, self)
        } else {
            if let Some(ext) = ext.as_ref().filter(|_| l2_hit && self.config.readahead) {
                if file.extension_readahead.on_miss(key.page) {
                    self.extension_readahead(file, ext, key, buf.len());
                }
            }
            match slot {
                Some(slot) => {
                    let frame = self.frame(file, key, &[], started, false, shared);
                    self.pool.finish_load_in(ticket, slot, frame, source, self)
                }
                None => {
                    let frame = self.frame(file, key, buf, started, false, shared);
                    self.pool.finish_load(ticket, frame, source, self)
                }
            }
        };
        // After the page asked for: pages reach L2 in the order they are installed, and a
        // later scan served by L2 reads ahead only through consecutive slots.
        if let Some(ahead) = ahead {
            self.install_read_ahead(file, ahead);
        }
        Ok(installed.then_some(read))
    }

    /// Reads a missed page into `dst`: from L2 (checked against its checksum there), from an
    /// earlier snapshot that holds it unchanged, or from the data file. Returns where it came
    /// from. On any miss `dst` is overwritten by the next tier.
    fn fetch(
        &self,
        file: &FileHandle,
        key: PageKey,
        dst: &mut [u8],
        ext: Option<&Arc<Extension>>,
        via: Via<'_>,
    ) -> Result<Found> {
        if let Some(ext) = ext {
            // A miss while a restore runs waits for it and looks again (see `await_restore`).
            if ext.read_in_place(key, dst)
                || (ext.await_restore(file.identity()) && ext.read_in_place(key, dst))
            {
                return Ok(Found::Extension);
            }
        }
        // A snapshot's page that an earlier snapshot holds unchanged (see `lineage.rs`).
        if let Some(tier) = self.copy_from_lineage(file, key.page, dst, ext) {
            return Ok(Found::Lineage(tier));
        }
        let (len, ahead) = self.read_data_file(file, key, dst, via)?;
        Ok(Found::DataFile(len, ahead))
    }

    /// Copies `page` of snapshot `file` from the cache of an earlier snapshot that holds it
    /// unchanged (RAM first, then the extension), counting it as a hit of that tier. None: no
    /// ancestor holds it, or the page changed since each one that does.
    fn copy_from_lineage(
        &self,
        file: &FileHandle,
        page: u64,
        buf: &mut [u8],
        ext: Option<&Arc<Extension>>,
    ) -> Option<Tier> {
        let lineage = file.lineage();
        if lineage.is_empty() {
            return None;
        }
        for ancestor in lineage.holders(page) {
            let key = PageKey::new(ancestor.key(), page);
            let tier = if self.pool.copy_if_resident(key, buf, self.now_ms()) {
                self.counters.l1_hits.bump();
                Tier::Memory
            } else if ext.is_some_and(|e| {
                // After a restart the ancestor's pages may still wait for their adoption.
                e.read(key, buf) || (e.await_restore(ancestor.identity()) && e.read(key, buf))
            }) {
                Tier::Extension
            } else {
                continue;
            };
            Counters::bump(&self.counters.pages_carried);
            return Some(tier);
        }
        None
    }

    /// Installs the pages a data-file readahead brought; returns how many.
    fn install_read_ahead(&self, file: &FileHandle, ahead: ReadAhead) -> u64 {
        let page_size = file.page_size();
        let mut fetched = 0;
        for (i, ticket) in ahead.tickets.into_iter().enumerate() {
            let Some(ticket) = ticket else {
                continue; // cached already: these bytes were read only to keep the request whole
            };
            let at = (ahead.skip + i) * page_size;
            let part = &ahead.chunk[at..at + page_size];
            if at + page_size <= ahead.got {
                let shared = ahead.shared.get(i).copied().flatten();
                let frame = self.frame(file, ticket.key, part, ahead.started, true, shared);
                self.pool
                    .finish_load(ticket, frame, LoadSource::DataFile, self);
                fetched += 1;
            } else {
                self.pool.abort(ticket);
            }
        }
        self.counters.page_reads.fetch_add(fetched, Relaxed);
        self.counters.readahead_pages.fetch_add(fetched, Relaxed);
        fetched
    }

    /// Reads the data-file window after `after` (the background readahead's job): the pages of
    /// `tickets` in one request through the file's own descriptor, installed as prefetched
    /// frames; every ticket is finished or aborted. A failed read costs the window only: the
    /// scan's own misses read those pages again, and report any error.
    pub(super) fn fetch_data_window(
        &self,
        file: &FileHandle,
        after: PageKey,
        tickets: Vec<Option<Ticket>>,
        started: Instant,
    ) {
        let page_size = file.page_size();
        let first = after.page + 1;
        let shared = self.read_under(file, &tickets);
        let mut chunk = vec![0u8; page_size * tickets.len()];
        let got = match self.device_read(file, Via(None), first * page_size as u64, &mut chunk) {
            Ok(n) => n,
            Err(_) => {
                tickets
                    .into_iter()
                    .flatten()
                    .for_each(|t| self.pool.abort(t));
                return;
            }
        };
        let pages = (got / page_size) as u64;
        file.readahead.fetched_until(first + pages);
        if pages > 0 {
            // Reading this window will fetch the next one in the background. Marked before
            // the pages are installed: a reader waiting for one of them reads it the moment
            // it is installed, and a mark set after that would miss its trigger, ending the
            // chain (the scan falls back to reading window by window in the foreground).
            file.readahead.mark_window(first);
        }
        let ahead = ReadAhead {
            chunk,
            skip: 0,
            got,
            tickets,
            shared,
            started,
        };
        self.install_read_ahead(file, ahead);
    }

    /// On a sequential run of L2 hits, loads the pages after `key` that L2 holds in the slots
    /// after its own, in one request, as prefetched frames.
    fn extension_readahead(
        &self,
        file: &FileHandle,
        ext: &Arc<Extension>,
        key: PageKey,
        page_size: usize,
    ) {
        let started = Instant::now();
        let tickets = self.readahead_tickets(key, page_size);
        self.fetch_run(file, ext, key, tickets, started);
    }

    /// Loader tickets for the window after `key`, up to the first page cached or in flight.
    pub(super) fn readahead_tickets(&self, key: PageKey, page_size: usize) -> Vec<Ticket> {
        let window = super::prefetch::window_pages(page_size, self.max_memory());
        (key.page + 1..key.page + window)
            .map_while(|page| self.pool.try_prefetch(PageKey::new(key.file, page)))
            .collect()
    }

    /// Loads the pages of `tickets` (the pages right after `key`) from the slots after `key`'s
    /// in one request; every ticket is finished or aborted.
    pub(super) fn fetch_run(
        &self,
        file: &FileHandle,
        ext: &Arc<Extension>,
        key: PageKey,
        tickets: Vec<Ticket>,
        started: Instant,
    ) {
        let page_size = file.page_size();
        let keys: Vec<PageKey> = tickets.iter().map(|t| t.key).collect();
        let run = ext.read_run(key, &keys, page_size);
        let verified = run.as_ref().map_or(0, |r| r.len);
        file.extension_readahead
            .fetched_until(key.page + 1 + verified as u64);
        if verified > 0 {
            // Marked before the pages are installed, as in `fetch_data_window`.
            file.extension_readahead.mark_window(key.page + 1);
        }
        for (i, ticket) in tickets.into_iter().enumerate() {
            match run.as_ref().filter(|_| i < verified) {
                Some(run) => {
                    let frame = self.frame(file, ticket.key, run.page(i), started, true, None);
                    self.pool
                        .finish_load(ticket, frame, LoadSource::Extension, self);
                }
                None => self.pool.abort(ticket),
            }
        }
    }

    /// A frame for L1, its bytes still in `data` (the pool copies them into its slab).
    pub(super) fn frame<'a>(
        &self,
        file: &FileHandle,
        key: PageKey,
        data: &'a [u8],
        started: Instant,
        prefetched: bool,
        shared: Option<SharedRead>,
    ) -> NewFrame<'a> {
        NewFrame {
            key,
            data,
            now_ms: self.now_ms(),
            read_micros: started.elapsed().as_micros().min(u32::MAX as u128) as u32,
            prefetched,
            from_extension: false,
            current_key: Some(file.key_cell().clone()),
            shared,
            dirty: false,
        }
    }

    /// For a shared extension, what each ticket's page is read under: its shared name and write
    /// epoch, taken before the read, so that a write by any process that overlaps or follows
    /// the read voids the page's admission (see `extension/shared`). Empty otherwise.
    fn read_under(&self, file: &FileHandle, tickets: &[Option<Ticket>]) -> Vec<Option<SharedRead>> {
        match self.current_extension().filter(|e| e.is_shared()) {
            Some(ext) => tickets
                .iter()
                .map(|t| t.as_ref().and_then(|t| ext.read_under(file, t.key)))
                .collect(),
            None => Vec::new(),
        }
    }

    /// One read of the data file, through the O_DIRECT descriptor if the file has one, else
    /// through `via`, with emulation and fault injection in front (benchmarks and tests).
    pub(super) fn device_read(
        &self,
        file: &FileHandle,
        via: Via<'_>,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize> {
        let data = file.data();
        if let Some(d) = data.as_deref() {
            if d.follows_os_cache() && file.rewrites.quiet(self.now_ms()) {
                d.follow_os_cache(false); // nobody rewrote it for a while: O_DIRECT again
            }
        }
        let own: Option<&dyn DataDevice> = data.as_deref().map(|d| d as &dyn DataDevice);
        let device = match (data.as_deref(), via.0) {
            (Some(d), _) if d.is_direct() => own,
            (_, Some(v)) => Some(v),
            _ => own,
        };
        let Some(device) = device else {
            return Err(Error::DataIo {
                path: file.path().to_path_buf(),
                source: std::io::Error::other("the file is not open"),
            });
        };
        let started = Instant::now();
        let read = Instrumented {
            inner: device,
            emulator: self.emulator.as_deref(),
            faults: &self.faults,
        }
        .read_at(offset, buf);
        let c = &self.counters;
        c.page_read_micros
            .fetch_add(started.elapsed().as_micros() as u64, Relaxed);
        Counters::bump(&c.page_read_requests);
        read.map_err(|source| Error::DataIo {
            path: file.path().to_path_buf(),
            source,
        })
    }

    /// Reads a page from the data file; on a sequential run, also the pages after it in one
    /// larger read, returned for [`Engine::install_read_ahead`] once the page itself is in.
    fn read_data_file(
        &self,
        file: &FileHandle,
        key: PageKey,
        buf: &mut [u8],
        via: Via<'_>,
    ) -> Result<(usize, Option<ReadAhead>)> {
        let page_size = buf.len();
        let offset = key.page * page_size as u64;
        let sequential = self.config.readahead && file.readahead.on_miss(key.page);
        let tickets = if sequential {
            self.prefetch_tickets(file, key, page_size)?
        } else {
            Vec::new()
        };
        if tickets.is_empty() {
            let n = self.device_read(file, via, offset, buf)?;
            Counters::bump(&self.counters.page_reads);
            return Ok((n, None));
        }
        let started = Instant::now();
        let shared = self.read_under(file, &tickets);
        let mut chunk = vec![0u8; page_size * (1 + tickets.len())];
        let got = match self.device_read(file, via, offset, &mut chunk) {
            Ok(n) => n,
            Err(e) => {
                tickets
                    .into_iter()
                    .flatten()
                    .for_each(|t| self.pool.abort(t));
                return Err(e);
            }
        };
        buf.copy_from_slice(&chunk[..page_size]);
        Counters::bump(&self.counters.page_reads);
        file.readahead
            .fetched_until(key.page + got.div_ceil(page_size) as u64);
        if got > page_size {
            // Reading the pages after this one will fetch the next window in the background.
            file.readahead.mark_window(key.page + 1);
        }
        let ahead = ReadAhead {
            chunk,
            skip: 1,
            got,
            tickets,
            shared,
            started,
        };
        Ok((got.min(page_size), Some(ahead)))
    }

    /// Loader tickets for the pages after `key` within the readahead window and the file, one
    /// per page, None for a page cached or being loaded already (SQLite's interior b-tree pages
    /// sit between runs of leaves and are usually cached: reading over them keeps the request
    /// whole). Ends at the last page that needs loading, and before the first page the
    /// extension holds: from there on the pages come cheaper from L2 (with its own readahead),
    /// and a stream that read over them from the data file would never return to L2.
    pub(super) fn prefetch_tickets(
        &self,
        file: &FileHandle,
        key: PageKey,
        page_size: usize,
    ) -> Result<Vec<Option<Ticket>>> {
        let window = super::prefetch::window_pages(page_size, self.max_memory());
        let size = match file.data() {
            Some(d) => d.size()?,
            None => 0,
        };
        let file_pages = size / page_size as u64;
        let mut end = (key.page + window).min(file_pages);
        if let Some(ext) = self.current_extension() {
            end = (key.page + 1..end)
                .find(|&page| ext.holds(PageKey::new(key.file, page)))
                .unwrap_or(end);
        }
        let mut tickets: Vec<Option<Ticket>> = (key.page + 1..end)
            .map(|page| self.pool.try_prefetch(PageKey::new(key.file, page)))
            .collect();
        while tickets.last().is_some_and(Option::is_none) {
            tickets.pop();
        }
        Ok(tickets)
    }

    /// Writes page `page` of `file` through to the data file, then caches the clean copy.
    pub fn write_page(&self, file: &FileHandle, page: u64, data: &[u8]) -> Result<()> {
        self.write_page_via(file, page, data, Via(None))
    }

    /// Writes page `page` of `file` through `via` (or the file's own descriptor), then caches
    /// the clean copy. The L2 copy is dropped before the data file is touched.
    pub fn write_page_via(
        &self,
        file: &FileHandle,
        page: u64,
        data: &[u8],
        via: Via<'_>,
    ) -> Result<()> {
        let page_size = file.page_size();
        if data.len() != page_size {
            return Err(Error::BufferSize {
                got: data.len(),
                page_size,
            });
        }
        // The key stays until the write is done: see CachedFile::key_change.
        let _stable = file.key_stable();
        let key = PageKey::new(file.key(), page);
        let (ticket, ext) = self.start_write(file, key);
        match self.write_to_file(file, page, data, via) {
            Ok(()) => {
                Counters::bump(&self.counters.page_writes);
                // A shared extension is told again now the bytes are in the file (see
                // `extension/shared`); the copy in RAM is current as of its epoch after that.
                let shared = ext.and_then(|e| e.now_written(file, key));
                let frame = self.written_frame(file, key, data, shared, false);
                self.pool.finish_write(ticket, Some(frame), self);
                Ok(())
            }
            Err(source) => {
                // What reached the disk is unknown: cache nothing of this page (and a shared
                // extension invalidates it again, as after any write).
                if let Some(e) = &ext {
                    e.written(file, key);
                }
                self.pool.finish_write(ticket, None, self);
                Err(Error::DataIo {
                    path: file.path().to_path_buf(),
                    source,
                })
            }
        }
    }

    /// The start of any page write (through or behind): the page is marked being written in L1
    /// (its copy dropped, loads in flight voided, readers wait), then its L2 copy is dropped;
    /// after begin_write no eviction can re-admit the old bytes, so that drop is final. The
    /// caller holds the file's key stable.
    pub(super) fn start_write(
        &self,
        file: &FileHandle,
        key: PageKey,
    ) -> (Ticket, Option<Arc<Extension>>) {
        let ticket = self.pool.begin_write(key);
        let ext = self.extension.read().clone();
        if let Some(ext) = &ext {
            ext.invalidate_page(file, key);
        }
        (ticket, ext)
    }

    /// The frame a write installs: its bytes still in `data`, `dirty` if the file has them not.
    pub(super) fn written_frame<'a>(
        &self,
        file: &FileHandle,
        key: PageKey,
        data: &'a [u8],
        shared: Option<SharedRead>,
        dirty: bool,
    ) -> NewFrame<'a> {
        NewFrame {
            key,
            data,
            now_ms: self.now_ms(),
            read_micros: 0,
            prefetched: false,
            from_extension: false,
            current_key: Some(file.key_cell().clone()),
            shared,
            dirty,
        }
    }

    /// Writes one page's bytes to the data file through `via` (or the file's own descriptor),
    /// charged to the emulated device and subject to injected faults. The page's offset is
    /// counted in pages of its own size (a page written behind before SQLite changed the page
    /// size is written back where it was written).
    pub(super) fn write_to_file(
        &self,
        file: &FileHandle,
        page: u64,
        data: &[u8],
        via: Via<'_>,
    ) -> std::io::Result<()> {
        let own = file.data();
        let device: Option<&dyn DataDevice> = match (via.0, own.as_deref()) {
            (Some(v), _) => Some(v),
            (None, Some(d)) => Some(d),
            (None, None) => None,
        };
        match device {
            Some(device) => Instrumented {
                inner: device,
                emulator: self.emulator.as_deref(),
                faults: &self.faults,
            }
            .write_at(page * data.len() as u64, data),
            None => Err(std::io::Error::other("the file is not open")),
        }
    }

    /// Forgets cached pages past a new end of the file (the caller truncated it).
    pub fn truncated(&self, file: &FileHandle, len: u64) {
        self.forget_pages_from(file.key(), len.div_ceil(file.page_size() as u64));
    }

    /// Truncates the data file through its own descriptor and forgets cached pages past the end.
    pub fn truncate(&self, file: &FileHandle, len: u64) -> Result<()> {
        if let Some(d) = file.data() {
            d.truncate(len)?;
        }
        self.truncated(file, len);
        Ok(())
    }

    /// Makes previous writes through the file's own descriptor durable (and drops them from the
    /// OS page cache). Charged as a flush of the emulated device, if there is one.
    pub fn sync(&self, file: &FileHandle) -> Result<()> {
        match file.data() {
            Some(d) => {
                self.charge_data_device(DeviceOp::Sync);
                d.sync()
            }
            None => Ok(()),
        }
    }

    /// True when data-file I/O is charged to an emulated device (benchmarks and tests).
    pub fn emulates_data_device(&self) -> bool {
        self.emulator.is_some()
    }

    /// What the emulated data device was charged so far; None without emulation.
    pub fn data_device_charges(&self) -> Option<DeviceCharges> {
        self.emulator.as_ref().map(|e| e.charges())
    }

    /// Charges `op` to the emulated data device, if there is one: blocks as long as the device
    /// would take. For I/O of a database's other files that the caller does itself (SQLite's
    /// journal and WAL, its syncs of the database), so that every file of a database is on the
    /// same emulated device as its pages. Free without emulation.
    pub fn charge_data_device(&self, op: DeviceOp) {
        if let Some(emulator) = &self.emulator {
            emulator.charge(op);
        }
    }

    /// Drops the file's clean pages from the OS page cache: for callers that made the writes
    /// durable themselves (SQLite's xSync on its own descriptor of the same file).
    pub fn release_os_cache(&self, file: &FileHandle) {
        if let Some(d) = file.data() {
            d.release_os_cache();
        }
    }
}
