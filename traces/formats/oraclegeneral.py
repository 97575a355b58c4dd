"""libCacheSim's oracleGeneral binary trace (traceReader/customizedReader/oracle/oracleGeneralBin.h),
the format of most recent cache papers' block-trace datasets: import and export.

Packed 24-byte little-endian records, no header: u32 clock_time (whole seconds), u64 obj_id,
u32 obj_size (bytes), i64 next_access_vtime: the 1-based number of the next request for the
same object, -1 (or INT64_MAX) when there is none, as libCacheSim's traceConv writes it.

A block trace's object is its block: obj_id is the 512-byte sector (libCacheSim's vscsi
conversion keeps the lbn), so an import reads offset = obj_id * 512 and length = obj_size.
The format has no operation: every request imports as a read, and the export writes reads
and writes alike (flushes and discards, which move no cacheable data, are left out and
counted). Whole-second times are spread evenly over their second on import, as Tencent's.
"""
import numpy as np

from traces.errors import TraceFormatError
from traces.formats import ordering, reading
from traces.schema import Op

NAME = "oraclegeneral"
DESCRIPTION = "libCacheSim oracleGeneral binary (u32 time s, u64 obj_id, u32 size, i64 next access)"
SECTOR = 512
RECORD = np.dtype([("time", "<u4"), ("obj_id", "<u8"), ("size", "<u4"), ("next", "<i8")])
assert RECORD.itemsize == 24
NEVER = -1
_SNIFF_RECORDS = 64
TIMING = ("oracleGeneral times are whole seconds: the requests sharing a second were spread "
          "evenly over it, so times within a second are not the captured ones.")


def sniff(path, head) -> bool:
    """Whole records whose next access is -1, INT64_MAX or later than themselves (and not
    absurdly far), with times that do not go back: text and the other binary formats fail."""
    count = min(_SNIFF_RECORDS, len(head) // RECORD.itemsize)
    if count < 1:
        return False
    records = np.frombuffer(head, RECORD, count=count)
    number = np.arange(1, count + 1)
    nxt = records["next"]
    plausible = (nxt == NEVER) | (nxt == np.iinfo(np.int64).max) | ((nxt > number) & (nxt < 1 << 40))
    return bool(plausible.all() and (np.diff(records["time"].astype(np.int64)) >= 0).all())


def read(paths, options):
    firsts = []
    for path in paths:
        with reading.open_text(path) as f:
            head = f.read(RECORD.itemsize)
        if len(head) < RECORD.itemsize:
            raise TraceFormatError(path, f"byte offset 0: the file ends {len(head)} bytes into a "
                                   f"{RECORD.itemsize}-byte record; it is cut short")
        firsts.append(int(np.frombuffer(head, RECORD, count=1)[0]["time"]))
    origin = min(firsts)
    metadata = {
        "description": "Imported from libCacheSim oracleGeneral traces: " + ", ".join(p.name for p in paths)
                       + ". " + TIMING,
        "source": {"kind": f"import:{NAME}", "time_origin_ns": origin * 10**9,
                   "timing": "spread-within-second", "object": "512-byte sector"},
    }
    meter = options.get("meter")
    streams = [ordering.spread_seconds(p, _chunks(p, meter, i if len(paths) > 1 else None), origin)
               for i, p in enumerate(paths)]
    return metadata, ordering.merge_sorted(streams)


def _where(index):
    return f"record {index} (byte offset {index * RECORD.itemsize})"


def _chunks(path, meter, device):
    last = None
    for index, records in reading.record_blocks(path, RECORD, meter):
        seconds = records["time"].astype(np.int64)
        down = np.flatnonzero(np.diff(np.r_[seconds[:1] if last is None else last, seconds]) < 0)
        if len(down):
            raise TraceFormatError(path, f"{_where(index + int(down[0]))}: time goes back; libCacheSim's "
                                   "traces are sorted by time")
        last = seconds[-1:]
        obj = records["obj_id"]
        if (bad := obj >= 1 << 54).any():
            raise TraceFormatError(path, f"{_where(index + int(bad.argmax()))}: obj_id {obj[bad.argmax()]} "
                                   "is no 512-byte block address (beyond 2^54 sectors); this trace's "
                                   "objects are not blocks")
        if (bad := records["size"] == 0).any():
            raise TraceFormatError(path, f"{_where(index + int(bad.argmax()))}: obj_size 0")
        chunk = {
            "ts_ns": seconds,  # whole seconds until ordering.spread_seconds
            "op": np.full(len(records), Op.READ, np.uint8),
            "offset": (obj * SECTOR).astype(np.int64),
            "length": records["size"].astype(np.int64),
            "_row": np.arange(index, index + len(records), dtype=np.int64),
        }
        if device is not None:
            chunk["device"] = np.full(len(records), device, np.uint32)
        yield chunk


def next_access(obj_id: np.ndarray) -> np.ndarray:
    """The 1-based number of the next request for the same object, NEVER when none follows."""
    order = np.argsort(obj_id, kind="stable")
    following = np.full(len(obj_id), NEVER, np.int64)
    same = obj_id[order][1:] == obj_id[order][:-1]
    following[order[:-1][same]] = order[1:][same] + 1
    return following


def write(trace, out, options):
    """Reads and writes of `trace` as oracleGeneral records: whole seconds from the trace's
    start, the 512-byte sector as obj_id. The next accesses need every obj_id at once: 8
    bytes a request in memory (a 100 M-request trace takes 0.8 GB)."""
    parts = []
    for chunk in trace.chunks(["ts_ns", "op", "offset", "length"]):
        data = (chunk["op"] == Op.READ) | (chunk["op"] == Op.WRITE)
        seconds = chunk["ts_ns"][data] // 10**9
        if len(seconds) and seconds[-1] > np.iinfo(np.uint32).max:
            raise TraceFormatError(trace.path, "the trace lasts longer than oracleGeneral's 32-bit "
                                   "seconds (136 years)")
        if (bad := chunk["length"][data] > np.iinfo(np.uint32).max).any():
            raise TraceFormatError(trace.path, f"an I/O of {chunk['length'][data][bad.argmax()]} bytes does "
                                   "not fit oracleGeneral's 32-bit obj_size")
        part = np.empty(int(data.sum()), RECORD)
        part["time"] = seconds
        part["obj_id"] = chunk["offset"][data] // SECTOR
        part["size"] = chunk["length"][data]
        parts.append(part)
    records = np.concatenate(parts) if parts else np.empty(0, RECORD)
    records["next"] = next_access(records["obj_id"])
    with open(out, "wb") as f:
        f.write(records.tobytes())
