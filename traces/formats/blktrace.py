"""blktrace binary records (struct blk_io_trace, version 0x07): import and export.

Reads per-CPU files as blktrace writes them (`dev.blktrace.N`, merged by time) or one merged
stream (`blkparse -d`), either byte order; writes one merged little-endian stream that
blkparse, btrecord and btreplay read. docs/formats.md describes the records.
"""
import glob
import itertools
import os
import re
import secrets
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from traces.errors import TraceFormatError
from traces.formats import reading
from traces.formats.inputs import open_input
from traces.schema import Flag, Op

NAME = "blktrace"
DESCRIPTION = "blktrace binary records: per-CPU files (dev.blktrace.N) or one merged stream (blkparse -d)"
EMPTY_FILES_OK = True  # the per-CPU file of an idle CPU is empty

MAGIC = 0x65617400
VERSION = 0x07
HEADER_BYTES = 48
_FIELDS = [
    ("magic", "u4"), ("sequence", "u4"), ("time", "u8"), ("sector", "u8"), ("bytes", "u4"),
    ("action", "u4"), ("pid", "u4"), ("device", "u4"), ("cpu", "u4"), ("error", "u2"),
    ("pdu_len", "u2"),
]
RECORD_LE = np.dtype([(n, "<" + t) for n, t in _FIELDS])
RECORD_BE = np.dtype([(n, ">" + t) for n, t in _FIELDS])
assert RECORD_LE.itemsize == HEADER_BYTES
_RECORD = {False: RECORD_LE, True: RECORD_BE}

# Action codes (low byte of `action`); bit 8 says a cgroup id precedes the payload.
ACT_QUEUE, ACT_ISSUE, ACT_COMPLETE = 1, 7, 8
# Each action code by the letters blkparse prints, in the order of a request's life.
ACTIONS = {"Q": 1, "M": 2, "F": 3, "G": 4, "S": 5, "R": 6, "I": 12, "D": 7, "C": 8, "P": 9,
           "U": 10, "UT": 11, "X": 13, "B": 14, "A": 15}
ACT_CGROUP = 0x100
# Categories (`action >> 16`).
TC_READ, TC_WRITE, TC_FLUSH, TC_SYNC = 1 << 0, 1 << 1, 1 << 2, 1 << 3
TC_QUEUE, TC_ISSUE, TC_COMPLETE, TC_FS = 1 << 4, 1 << 6, 1 << 7, 1 << 8
TC_NOTIFY, TC_AHEAD, TC_META, TC_DISCARD, TC_FUA = 1 << 10, 1 << 11, 1 << 12, 1 << 13, 1 << 15
# Notify record codes.
TN_PROCESS, TN_TIMESTAMP = 0, 1

EVENTS = {"issue": ACT_ISSUE, "queue": ACT_QUEUE}
_FLAG_BITS = ((TC_SYNC, Flag.SYNC), (TC_FUA, Flag.FUA), (TC_META, Flag.META),
              (TC_AHEAD, Flag.READAHEAD))

DEFAULT_DEVICE = (8 << 20) | 0  # 8,0: what the exporter writes for a trace without devices
UNMATCHED = -1  # latency_ns of an I/O whose completion is not in the trace

_BLOCK_BYTES = 8 << 20  # bytes read per file per step
_WINDOW_RECORDS = 1 << 20  # records matched per step
# An I/O still waiting for its completion is held back (with everything after it) for at
# most this much trace time, and at most _MAX_CARRY records, then given up as unmatched.
_HORIZON_NS = 30 * 10**9
_MAX_CARRY = _WINDOW_RECORDS // 2


def dev_t(major: int, minor: int) -> int:
    return (major << 20) | minor


def dev_name(device: int) -> str:
    return f"{device >> 20},{device & 0xFFFFF}"


def sniff(path, head: bytes) -> bool:
    if len(head) < HEADER_BYTES:
        return False
    return any(
        (int.from_bytes(head[:4], order) & 0xFFFFFF00) == MAGIC for order in ("little", "big")
    )


def input_files(paths) -> list[Path]:
    """The files behind `paths`: each a file, or a prefix `dev` of `dev.blktrace.N` files."""
    files = []
    for path in map(Path, paths):
        if path.is_file():
            files.append(path)
            continue
        cpus = glob.glob(glob.escape(str(path)) + ".blktrace.*")
        numbered = sorted(
            (int(m.group(1)), p) for p in cpus if (m := re.search(r"\.blktrace\.(\d+)$", p))
        )
        if not numbered:
            raise TraceFormatError(
                path, "no such file, and no per-CPU files named like it (PATH.blktrace.N)"
            )
        files.extend(Path(p) for _, p in numbered)
    return files


# ---------------------------------------------------------------- decoding records
# The kernels are in blktrace_kernels, imported by the functions that call them: importing
# this module (as sniffing does for every input) loads no Numba.


def _decoded(array: np.ndarray, big: bool):
    """(columns, end, bad offset or -1, notify record offsets) of the records in `array`."""
    room = array.size // HEADER_BYTES + 1
    columns = {name: np.empty(room, dtype) for name, dtype in _COLUMN_DTYPES.items()}
    notify = np.empty(room, np.int64)
    from traces.formats.blktrace_kernels import decode

    count, end, bad, notes = decode(array, big, *columns.values(), notify)
    return {name: values[:count] for name, values in columns.items()}, end, bad, notify[:notes]


_COLUMN_DTYPES = {"time": np.int64, "sector": np.uint64, "bytes": np.uint32,
                  "action": np.uint32, "pid": np.uint32, "device": np.uint32}


def _file_blocks(path: Path):
    """Yield (columns, notes) for successive blocks of one time-ordered record file.

    notes: [("comm", pid, name) | ("clock", time, realtime_ns)] from notify records.
    One buffer is reused: a record cut by a block's end moves to its front (records are at
    most 48 + 65535 bytes), and the next block is read in after it.
    """
    try:
        f = open_input(path)
    except OSError as e:
        raise TraceFormatError(path, f"cannot read: {e.strerror or e}") from None
    with f:
        buf = bytearray(_BLOCK_BYTES + HEADER_BYTES + 0xFFFF)
        view = memoryview(buf)
        held = 0  # bytes of a cut record at the front of buf
        consumed = 0  # byte offset of buf's first byte in the (decompressed) file
        big = None
        while True:
            filled = held
            try:
                while filled < _BLOCK_BYTES and (got := f.readinto(view[filled:_BLOCK_BYTES + held])):
                    filled += got
            except Exception as e:  # OSError, EOFError, LZMAError, ZstdError: a damaged input
                raise TraceFormatError(path, f"byte offset {consumed + filled}: cannot read ({e})") from None
            at_end = filled < _BLOCK_BYTES
            if not filled:
                return
            if big is None:
                big = _byte_order(path, bytes(view[:min(filled, 4)]))
            array = np.frombuffer(buf, np.uint8, count=filled)
            columns, end, bad, notify = _decoded(array, big)
            if bad >= 0:
                _refuse(path, view[bad:bad + 4].tobytes(), consumed + bad, big)
            if at_end and end < filled:
                raise TraceFormatError(
                    path,
                    f"byte offset {consumed + end}: truncated record ({filled - end} bytes of "
                    "a record at the end of the file); the file is cut short",
                )
            notes = _notes(path, view, notify, big, consumed)
            yield columns, notes
            held = filled - end
            buf[:held] = view[end:filled]
            consumed += end
            if at_end:
                return


def _byte_order(path, head: bytes) -> bool:
    """True for a big-endian file, from its first record's magic."""
    if len(head) < 4 and any(
        (MAGIC | VERSION).to_bytes(4, order).startswith(head) for order in ("little", "big")
    ):
        raise TraceFormatError(
            path, f"byte offset 0: truncated record ({len(head)} bytes); the file is cut short"
        )
    for big, order in ((False, "little"), (True, "big")):
        if (int.from_bytes(head[:4], order) & 0xFFFFFF00) == MAGIC:
            return big
    raise TraceFormatError(
        path,
        f"byte offset 0: not a blktrace record (magic 0x{int.from_bytes(head[:4], 'little'):08x}); "
        "give blktrace's per-CPU files or blkparse -d output",
    )


def _refuse(path, head: bytes, offset: int, big: bool):
    magic = int.from_bytes(head, "big" if big else "little")
    if (magic & 0xFFFFFF00) == MAGIC:
        raise TraceFormatError(
            path,
            f"byte offset {offset}: blktrace record version 0x{magic & 0xFF:02x}; this reader "
            f"knows version 0x{VERSION:02x} (48-byte records) only",
        )
    raise TraceFormatError(
        path,
        f"byte offset {offset}: not a blktrace record (magic 0x{magic:08x}); the file is "
        "damaged, or a record's pdu_len is wrong",
    )


def _notes(path, buf, notify, big, consumed) -> list:
    """The process-name and clock notes of the notify records at byte offsets `notify`."""
    notes = []
    order = "big" if big else "little"
    for start in (notify + HEADER_BYTES).tolist():
        head = np.frombuffer(buf, _RECORD[big], count=1, offset=start - HEADER_BYTES)[0]
        action = int(head["action"])
        payload = bytes(buf[start:start + int(head["pdu_len"])])
        if action & ACT_CGROUP:
            payload = payload[8:]
        code = action & 0xFF
        if code == TN_PROCESS:
            name = payload.split(b"\0", 1)[0].decode("utf-8", "replace")
            notes.append(("comm", int(head["pid"]), name))
        elif code == TN_TIMESTAMP:
            if len(payload) < 8:
                raise TraceFormatError(
                    path, f"byte offset {consumed + start - HEADER_BYTES}: timestamp note with a "
                    f"{len(payload)}-byte payload, expected 8",
                )
            sec = int.from_bytes(payload[0:4], order)
            nsec = int.from_bytes(payload[4:8], order)
            notes.append(("clock", int(head["time"]), sec * 10**9 + nsec))
    return notes


def _concat(parts: list[dict]) -> dict:
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


def _take(columns: dict, index) -> dict:
    return {name: values[index] for name, values in columns.items()}


def _merged_blocks(files: list[Path]):
    """Yield (columns, notes) blocks of all files merged by time, in bounded memory.

    Each file is time-ordered; a block holds every record up to the earliest last time of
    the files still being read, so nothing later can sort before it.
    """
    sources = [_file_blocks(f) for f in files]
    if len(sources) == 1:
        yield from sources[0]
        return
    pending = [None] * len(sources)
    done = [False] * len(sources)
    while True:
        notes = []
        for i, source in enumerate(sources):
            while not done[i] and (pending[i] is None or not len(pending[i]["time"])):
                block = next(source, None)
                if block is None:
                    done[i] = True
                else:
                    pending[i] = block[0]
                    notes.extend(block[1])
        live = [p for p in pending if p is not None and len(p["time"])]
        if not live:
            if notes:
                yield _concat([_empty_columns()]), notes
            return
        bounds = [pending[i]["time"][-1] for i in range(len(sources))
                  if not done[i] and pending[i] is not None and len(pending[i]["time"])]
        watermark = min(bounds) if bounds else None
        parts = []
        for i, p in enumerate(pending):
            if p is None or not len(p["time"]):
                continue
            n = len(p["time"]) if watermark is None else int(np.searchsorted(p["time"], watermark, "right"))
            parts.append(_take(p, slice(0, n)))
            pending[i] = _take(p, slice(n, None))
        yield _merge(parts), notes


def _merge(parts: list[dict]) -> dict:
    """One block of the parts' events ordered by (time, stage), stably: at equal times from
    different CPUs, queue events first and completions last, as a request's life goes."""
    from traces.formats.blktrace_kernels import merge_two, ordered

    if all(ordered(p["time"], p["action"]) for p in parts):
        merged = parts[0]
        for part in parts[1:]:
            merged = dict(zip(merged, merge_two(*merged.values(), *part.values())))
        return merged
    # A part not in (time, stage) order: sort. One int64 key, stable (lexsort took 3x as long).
    merged = _concat(parts)
    code = merged["action"] & 0xFF
    stage = np.where(code == ACT_QUEUE, 0, np.where(code == ACT_COMPLETE, 2, 1))
    key = (merged["time"] - merged["time"].min()) * 4 + stage
    return _take(merged, np.argsort(key, kind="stable"))


def _empty_columns() -> dict:
    return {name: np.empty(0, dtype) for name, dtype in _COLUMN_DTYPES.items()}


# ---------------------------------------------------------------- events to I/Os

QUEUE_SLOTS = 1 << 16  # direct-mapped tables of recent Q events: the pid of each D, merges


_ROW_COLUMNS = ("ts_ns", "offset", "length", "latency_ns", "pid", "device", "op", "flags")


class _Matcher:
    """Turns a time-ordered stream of event blocks into chunks of I/O rows.

    Rows are emitted in time order once their completion is seen (or given up on), so an
    I/O waiting at the end of a window holds back the rows after it until the next one.
    """

    def __init__(self, path, event: str, metadata: dict):
        if event not in EVENTS:
            raise TraceFormatError(path, f"unknown event {event!r}; use one of {', '.join(EVENTS)}")
        self.path, self.code, self.event = path, EVENTS[event], event
        self.metadata = metadata
        self.comm: dict[int, str] = {}
        self.t0 = None
        self.columns = None  # optional columns, chosen from the first window
        self.seen_completions = False
        self.devices: set[int] = set()
        self.stats = {"records": 0, "ios": 0, "unmatched_ios": 0, "unmatched_completions": 0,
                      "preflush_writes": 0}
        self.actions = np.zeros(256, np.int64)  # records per action code, for a clear refusal

    def note(self, notes):
        for note in notes:
            if note[0] == "comm":
                self.comm[note[1]] = note[2]
            elif note[0] == "clock" and "start_wallclock" not in self.metadata:
                # The note's realtime clock, moved back to the first record (ts_ns 0).
                start_ns = note[2] - (note[1] - self.t0)
                self.metadata["start_wallclock"] = datetime.fromtimestamp(
                    start_ns / 1e9, timezone.utc).isoformat()

    def chunks(self, blocks):
        """blocks: iterator of (columns, notes), time-ordered; yields row chunks."""
        carry = None
        window, size = [], 0
        for columns, notes in blocks:
            if self.t0 is None and len(columns["time"]):
                self.t0 = int(columns["time"][0])
                self.metadata["source"]["time_origin_ns"] = self.t0  # the clock's value at ts_ns 0
            self.note(notes)
            self.stats["records"] += len(columns["time"])
            events = columns["action"][(columns["action"] >> 16) & TC_NOTIFY == 0]
            self.actions += np.bincount(events & 0xFF, minlength=256)[:256]
            window.append(columns)
            size += len(columns["time"])
            if size >= _WINDOW_RECORDS:
                events = _concat(([carry] if carry else []) + window)
                window, size = [], 0
                rows, carry = self._window(events, final=False)
                if rows is not None:
                    yield rows
        if carry or window:
            events = _concat(([carry] if carry else []) + window)
            rows, _ = self._window(events, final=True)
            if rows is not None:
                yield rows
        if self.stats["ios"] == 0:
            self._refuse_empty()
        self.metadata["source"].update(self.stats)
        self.metadata["source"]["devices"] = sorted(dev_name(d) for d in self.devices)

    def _refuse_empty(self):
        """No I/O at all: say which events the input has, when the other --event would do."""
        seen = "/".join(letter for letter, code in ACTIONS.items() if self.actions[code])
        if self.event == "queue" and not self.actions[ACT_QUEUE] and self.actions[ACT_ISSUE]:
            raise TraceFormatError(self.path, f"no Q events; this trace has {seen} only: use --event issue")
        if self.event == "issue" and not self.actions[ACT_ISSUE] and self.actions[ACT_QUEUE]:
            raise TraceFormatError(self.path, f"no D events; this trace has {seen} only: use --event queue")

    def _window(self, ev, final):
        if len(ev["time"]) == 0:
            return None, None
        from traces.formats.blktrace_kernels import classify, match, window_rows

        kind = classify(ev["action"], ev["bytes"], self.code, self.code == ACT_ISSUE)
        partner, queued_by = match(kind, ev["device"], ev["sector"], ev["bytes"], QUEUE_SLOTS)
        columns, preflush, carry, unmatched, seen_completion = window_rows(
            kind, partner, queued_by, ev["time"], ev["sector"], ev["bytes"], ev["action"],
            ev["pid"], ev["device"], self.t0, final, _HORIZON_NS, _MAX_CARRY)
        self.stats["unmatched_completions"] += unmatched
        self.seen_completions = self.seen_completions or seen_completion
        rows = self._rows(dict(zip(_ROW_COLUMNS, columns)), preflush)
        return rows, (_take(ev, carry) if len(carry) else None)

    def _rows(self, out, preflush):
        device = out["device"]
        if len(device) and device.min() == device.max():
            self.devices.add(int(device[0]))
        else:
            self.devices.update(np.unique(device).tolist())
        if self.columns is None and len(device):
            # The columns are chosen with the first rows and kept for every chunk.
            self.columns = ["ts_ns", "op", "offset", "length", "pid", "flags"]
            if self.seen_completions:
                self.columns.append("latency_ns")
            if len(self.devices) > 1:
                self.columns.append("device")
            if self.comm:
                self.columns.append("comm")
        elif self.columns is not None and "device" not in self.columns and len(self.devices) > 1:
            raise TraceFormatError(
                self.path,
                f"a second device ({', '.join(dev_name(d) for d in sorted(self.devices))}) "
                f"appears after the first {_WINDOW_RECORDS} records; import each device's "
                "files separately",
            )
        if self.columns is None:
            return None
        # A write with a pre-flush is two I/Os: the flush, then the write.
        if preflush.any():
            repeat = np.where(preflush, 2, 1)
            out = {name: np.repeat(values, repeat) for name, values in out.items()}
            first = np.cumsum(repeat) - repeat
            flush_rows = first[preflush]
            out["op"][flush_rows] = Op.FLUSH
            out["length"][flush_rows] = 0
            out["offset"][flush_rows] = 0
            out["flags"][flush_rows] &= np.uint8(Flag.SYNC)
            self.stats["preflush_writes"] += int(preflush.sum())
        self.stats["ios"] += len(out["ts_ns"])
        self.stats["unmatched_ios"] += int(np.count_nonzero(out["latency_ns"] == UNMATCHED))
        if "comm" in self.columns:
            unique, inverse = np.unique(out["pid"], return_inverse=True)
            names = np.array([self.comm.get(int(p)) for p in unique] + [None], dtype=object)[:-1]
            out["comm"] = names[inverse.reshape(-1)]
        return {name: out[name] for name in self.columns} if self.columns else None


def _prime(metadata, chunks):
    """Compute the first chunk now, so input errors and metadata come from read() itself."""
    first = next(chunks, None)
    return metadata, (chunks if first is None else itertools.chain([first], chunks))


# Blocks made ahead: a matching window's worth and two more. With two, the decoder stopped
# while a window was matched and the matcher waited while the next one was decoded: one
# stream went from 19.5-21.9 to 25.6-27.3 M records/s, per-CPU files from 11.6-15.1 to 16-28.
_PREFETCH_BLOCKS = 2 + _WINDOW_RECORDS * HEADER_BYTES // _BLOCK_BYTES


def read(paths, options=None):
    """(metadata, chunk iterator) of the I/Os in blktrace files; see the module docstring.

    options: event = "issue" (D, default) or "queue" (Q) as the I/O record. latency_ns is
    completion - event time, or -1 where no completion matched. The metadata's source
    counts (records, ios, unmatched_ios, ...) are complete once the iterator is exhausted.
    """
    options = options or {}
    files = input_files(paths if isinstance(paths, (list, tuple)) else [paths])
    event = options.get("event") or "issue"
    metadata = {
        "source": {"kind": f"import:{NAME}", "files": [str(f) for f in files], "event": event},
    }
    matcher = _Matcher(files[0], event, metadata)
    # Reading, decoding and merging (a thread) overlap the matching: both release the GIL.
    blocks = reading.prefetch(_merged_blocks(files), _PREFETCH_BLOCKS)
    return _prime(metadata, matcher.chunks(iter(blocks)))




# ---------------------------------------------------------------- export


def _category(op: np.ndarray, flags: np.ndarray, stage: str) -> np.ndarray:
    """Category bits of each row's Q, D or C event, as the kernel sets them."""
    cat = np.zeros(op.shape, np.uint32)
    cat[op == Op.READ] = TC_READ
    cat[op == Op.WRITE] = TC_WRITE
    cat[op == Op.DISCARD] = TC_WRITE | TC_DISCARD
    # An empty pre-flush bio is queued as a write; the flush request is issued as a read.
    cat[op == Op.FLUSH] = (TC_WRITE if stage == "Q" else TC_READ) | TC_FLUSH
    for bit, flag in _FLAG_BITS:
        cat[(flags & np.uint8(flag)) != 0] |= bit
    cat |= {"Q": TC_QUEUE, "D": TC_ISSUE | TC_FS, "C": TC_COMPLETE | TC_FS}[stage]
    return cat


def _note(time: int, pid: int, code: int, payload: bytes, device: int) -> bytes:
    record = np.zeros(1, RECORD_LE)
    record["magic"] = MAGIC | VERSION
    record["time"] = time
    record["action"] = (TC_NOTIFY << 16) | code
    record["pid"] = pid
    record["device"] = device
    record["pdu_len"] = len(payload)
    return record.tobytes() + payload


def _parse_device(text) -> int:
    if isinstance(text, int):
        return text
    major, _, minor = str(text).partition(",")
    return dev_t(int(major), int(minor))


def write(trace, out, options=None) -> None:
    """Export `trace` (a TraceFile) as one blktrace stream at `out`: Q, D and, where the
    trace has a latency, C events per I/O, with process and start-time notes.

    options: device = "MAJ,MIN" for a trace without a device column (default 8,0).
    The file appears whole or not at all.
    """
    options = options or {}
    out = Path(out)
    default_device = _parse_device(options.get("device") or DEFAULT_DEVICE)
    tmp = out.with_name(f"{out.name}.{secrets.token_hex(4)}.partial")
    start_ns = 0
    if trace.metadata.get("start_wallclock"):
        try:
            start_ns = int(datetime.fromisoformat(trace.metadata["start_wallclock"]).timestamp() * 10**9)
        except (TypeError, ValueError):
            start_ns = 0
    try:
        with open(tmp, "wb") as f:
            f.write(_note(0, 0, TN_TIMESTAMP,
                          np.array([start_ns // 10**9, start_ns % 10**9], "<u4").tobytes(),
                          default_device))
            _write_events(trace, f, default_device)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_events(trace, f, default_device):
    wanted = [c for c in ("ts_ns", "op", "offset", "length", "latency_ns", "pid", "flags",
                          "device", "comm") if trace.has(c)]
    carry = np.zeros(0, RECORD_LE)  # completions due after the chunk's last issue
    carry_cls = np.zeros(0, np.uint8)
    carry_row = np.zeros(0, np.int64)
    named: dict[int, str] = {}
    first_row = 0
    sequence = 1
    for chunk in trace.chunks(wanted):
        n = len(chunk["ts_ns"])
        if n == 0:
            continue
        offset, length = chunk["offset"], chunk["length"]
        bad = np.flatnonzero(offset % 512)
        if bad.size:
            raise TraceFormatError(
                trace.path, f"offset {offset[bad[0]]} is not a multiple of 512; blktrace "
                "records 512-byte sectors", column="offset", row=first_row + int(bad[0]))
        bad = np.flatnonzero(length > 0xFFFFFFFF)
        if bad.size:
            raise TraceFormatError(
                trace.path, f"length {length[bad[0]]} does not fit blktrace's 32-bit bytes",
                column="length", row=first_row + int(bad[0]))
        ts = chunk["ts_ns"]
        op = chunk["op"]
        flags = chunk["flags"] if "flags" in chunk else np.zeros(n, np.uint8)
        pid = chunk["pid"].astype(np.uint32) if "pid" in chunk else np.zeros(n, np.uint32)
        device = chunk["device"] if "device" in chunk else np.full(n, default_device, np.uint32)
        latency = chunk["latency_ns"] if "latency_ns" in chunk else np.full(n, -1, np.int64)
        done = latency >= 0
        parts, classes, row_numbers = [carry], [carry_cls], [carry_row]
        for stage, cls, rows, time in (("Q", 1, slice(None), ts), ("D", 2, slice(None), ts),
                                       ("C", 3, done, ts[done] + latency[done])):
            records = np.zeros(len(time), RECORD_LE)
            records["magic"] = MAGIC | VERSION
            records["time"] = time
            records["sector"] = offset[rows] // 512
            records["bytes"] = length[rows]
            code = {"Q": ACT_QUEUE, "D": ACT_ISSUE, "C": ACT_COMPLETE}[stage]
            records["action"] = (_category(op[rows], flags[rows], stage) << 16) | code
            records["pid"] = pid[rows]
            records["device"] = device[rows]
            parts.append(records)
            classes.append(np.full(len(time), cls, np.uint8))
            row_numbers.append(first_row + np.arange(n)[rows])
        records = np.concatenate(parts)
        cls = np.concatenate(classes)
        row = np.concatenate(row_numbers)
        # Time order; at equal times each I/O's Q then D, then the completions, so that the
        # reader pairs every D with its own Q and never sees a C before its D.
        order = np.lexsort((cls, row, cls == 3, records["time"]))
        records, cls, row = records[order], cls[order], row[order]
        due = int(np.searchsorted(records["time"], ts[-1], "right"))
        records, carry, carry_cls, carry_row = records[:due], records[due:], cls[due:], row[due:]
        records["sequence"] = _sequence(sequence, len(records))
        sequence += len(records)
        notes = _process_notes(chunk, named, device)
        if not notes:
            f.write(records.tobytes())
        else:
            # A process note goes just before the first event of its pid.
            at = 0
            for time, p, name, dev in notes:
                where = int(np.searchsorted(records["time"], time, "left"))
                f.write(records[at:where].tobytes())
                at = where
                f.write(_note(time, p, TN_PROCESS, name.encode()[:15].ljust(16, b"\0"), dev))
            f.write(records[at:].tobytes())
        first_row += n
    if len(carry):
        carry["sequence"] = _sequence(sequence, len(carry))
        f.write(carry.tobytes())


def _sequence(start: int, count: int) -> np.ndarray:
    return (np.arange(start, start + count, dtype=np.int64) & 0xFFFFFFFF).astype(np.uint32)


def _process_notes(chunk, named, device) -> list:
    """(time, pid, comm, device) for each pid whose name is new or changed in this chunk."""
    if "comm" not in chunk or "pid" not in chunk:
        return []
    pids, first = np.unique(chunk["pid"], return_index=True)
    notes = []
    for p, i in zip(pids.tolist(), first.tolist()):
        name = chunk["comm"][i]
        if name is not None and named.get(p) != name:
            named[p] = name
            notes.append((int(chunk["ts_ns"][i]), p, name, int(device[i])))
    notes.sort()
    return notes
