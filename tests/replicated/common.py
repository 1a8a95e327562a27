"""What the writer, the oracle and the bpe readers agree on: the table and each row's value.

Every row is (id, v) with v = "<id>:<version>:" and a filler derived from both, so a reader can
tell the version it was served and whether the bytes are the row's at all (a torn or foreign
page would not parse, or would not match its own filler).
"""

ROW_BYTES = 200
COUNTERS = (
    "Buffer cache hit ratio",  # L1 hits (numerator)
    "Buffer cache hit ratio base",  # page lookups
    "Page reads/sec",  # misses read from the database file
    "Extension page reads/sec",  # L2 (SSD extension) hits
    "File cache invalidations",  # whole-file forgets
    "Pages invalidated by other processes",  # pages forgotten one by one
)


def value(row_id: int, version: int) -> str:
    head = f"{row_id}:{version}:"
    seed = str(row_id * 7919 + version * 104729)
    filler = (seed * (ROW_BYTES // len(seed) + 1))[: ROW_BYTES - len(head)]
    return head + filler


def parse(row_id: int, v) -> int:
    """The version a row's value carries, or -1 if the value is not one the writer made."""
    if not isinstance(v, str):
        return -1
    parts = v.split(":", 2)
    if len(parts) != 3 or parts[0] != str(row_id) or not parts[1].isdigit():
        return -1
    version = int(parts[1])
    return version if v == value(row_id, version) else -1


def wal_index(db):
    """(mxFrame, nBackfill, salt1, iChange) from the wal-index header in `<db>-shm`, or None.
    Read without locks: a trace for the reports, never a check."""
    import struct

    try:
        with open(db + "-shm", "rb") as f:
            h = f.read(136)
    except OSError:
        return None
    if len(h) < 136:
        return None
    change, mx = struct.unpack_from("=II", h, 8)[0], struct.unpack_from("=I", h, 16)[0]
    salt1 = struct.unpack_from("=I", h, 32)[0]
    backfill = struct.unpack_from("=I", h, 96)[0]
    return [mx, backfill, salt1, change]
