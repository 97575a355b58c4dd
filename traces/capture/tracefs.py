"""Block-event capture through a private tracefs instance, and the ring-buffer page decoder.

Works under kernel lockdown, where blktrace's relay files are refused. Every layout (page
header, event header, event fields) is read from tracefs at run time, never hard-coded.
"""
import errno
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numba
import numpy as np

from traces.errors import ReplayError, TraceFormatError
from traces.kernel_types import I64, U8, ro_c

EVENTS = ("block_rq_issue", "block_rq_complete", "block_bio_queue")
# The sleep system calls, entry and exit, of every process: a process that sleeps between two
# of its I/Os is waiting for something (a lock it polls for, a timer), not computing. Traced
# where the kernel has syscall tracepoints; the capture keeps those of processes that did I/O.
SLEEP_EVENTS = ("sys_enter_nanosleep", "sys_exit_nanosleep",
                "sys_enter_clock_nanosleep", "sys_exit_clock_nanosleep")
DEFAULT_BUFFER_KB = 65536
# Commit word flags (kernel/trace/ring_buffer.c): events were lost before this page, and
# their count is stored as a long right after the page's data.
RB_MISSED_EVENTS = 1 << 31
RB_MISSED_STORED = 1 << 30
_RB_MISSED_MASK = RB_MISSED_EVENTS | RB_MISSED_STORED
# With nothing read in a pass over the CPUs, wait this long: short enough that a 64 MiB
# buffer per CPU never fills between passes (~10 MB/s of events at 100k IOPS).
_IDLE_SLEEP_S = 0.02


class CaptureError(ReplayError):
    """The capture cannot be set up or run (no tracefs, not root, no such device)."""


# ---------------------------------------------------------------------------------------
# Formats read from tracefs
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Field:
    offset: int
    size: int
    signed: bool


@dataclass
class EventFormat:
    """One event's `format` file: its id and its fields by name."""

    name: str
    id: int
    fields: dict[str, Field] = field(default_factory=dict)


_FIELD_RE = re.compile(
    r"field:\s*(?P<decl>[^;]+);\s*offset:(?P<offset>\d+);\s*size:(?P<size>\d+);"
    r"\s*signed:(?P<signed>-?\d+);"
)


def _field_name(decl: str) -> str:
    # "unsigned int nr_sector", "char rwbs[10]", "__data_loc char[] cmd"
    return re.sub(r"\[.*?\]", "", decl).split()[-1]


def parse_fields(text: str) -> dict[str, Field]:
    fields = {}
    for m in _FIELD_RE.finditer(text):
        fields.setdefault(
            _field_name(m["decl"]),
            Field(int(m["offset"]), int(m["size"]), m["signed"] not in ("0",)),
        )
    return fields


def parse_format(text: str) -> EventFormat:
    """Parse an `events/SYSTEM/EVENT/format` file."""
    name = re.search(r"^name:\s*(\S+)", text, re.M)
    ident = re.search(r"^ID:\s*(\d+)", text, re.M)
    if not name or not ident:
        raise CaptureError("tracefs event format without a name or an ID; is this a tracefs format file?")
    return EventFormat(name[1], int(ident[1]), parse_fields(text))


@dataclass(frozen=True)
class PageLayout:
    """Where a ring-buffer page keeps its timestamp, commit word and data (events/header_page)."""

    page_size: int
    ts_offset: int
    commit_offset: int
    commit_size: int
    data_offset: int


def parse_header_page(text: str, page_size: int | None = None) -> PageLayout:
    fields = parse_fields(text)
    try:
        ts, commit, data = fields["timestamp"], fields["commit"], fields["data"]
    except KeyError as exc:
        raise CaptureError(f"events/header_page has no field {exc}; unknown ring-buffer layout") from None
    if ts.size != 8 or commit.size not in (4, 8):
        raise CaptureError(f"unsupported ring-buffer page header: timestamp {ts.size} B, commit {commit.size} B")
    return PageLayout(page_size or data.offset + data.size, ts.offset, commit.offset, commit.size,
                      data.offset)


@dataclass(frozen=True)
class EventHeader:
    """The compressed event header (events/header_event): type_len codes and the delta width."""

    padding: int = 29
    time_extend: int = 30
    time_stamp: int = 31
    data_max: int = 28
    delta_bits: int = 27


def parse_header_event(text: str) -> EventHeader:
    def number(pattern, default):
        m = re.search(pattern, text)
        return int(m[1]) if m else default

    type_bits = number(r"type_len\s*:\s*(\d+)\s*bits", 5)
    delta_bits = number(r"time_delta\s*:\s*(\d+)\s*bits", 27)
    if type_bits + delta_bits != 32:
        raise CaptureError(f"unsupported event header: type_len {type_bits} + time_delta {delta_bits} bits")
    return EventHeader(
        padding=number(r"padding\s*:\s*type\s*==\s*(\d+)", 29),
        time_extend=number(r"time_extend\s*:\s*type\s*==\s*(\d+)", 30),
        time_stamp=number(r"time_stamp\s*:\s*type\s*==\s*(\d+)", 31),
        data_max=number(r"data max type_len\s*==\s*(\d+)", 28),
        delta_bits=delta_bits,
    )


# ---------------------------------------------------------------------------------------
# Page walking: one sequential pass (event lengths vary), then numpy gathers the fields
# ---------------------------------------------------------------------------------------

@numba.njit(inline="always")
def _u32(buf, i):
    return (np.uint32(buf[i]) | (np.uint32(buf[i + 1]) << 8) | (np.uint32(buf[i + 2]) << 16)
            | (np.uint32(buf[i + 3]) << 24))


@numba.njit(inline="always")
def _u64(buf, i):
    return np.uint64(_u32(buf, i)) | (np.uint64(_u32(buf, i + 4)) << np.uint64(32))


@numba.njit((ro_c(U8), I64, I64, I64, I64, I64, I64, I64, I64, I64, I64), nogil=True, cache=True)
def walk_pages(buf, page_size, ts_off, commit_off, commit_size, data_off,
               padding, time_extend, time_stamp, data_max, delta_bits):
    """Walk little-endian ring-buffer pages: every data event's payload offset, length and time.

    Returns (payload offsets, payload lengths, timestamps, n events, missed-event count
    per page (-1: events were lost but the kernel did not store how many), bad byte offset
    or -1, reason code). Timestamps follow the kernel reader: deltas add up from the page's
    timestamp, a time extend adds its 59-bit delta, an absolute stamp replaces the low bits.
    """
    n_pages = buf.size // page_size
    cap = n_pages * ((page_size - data_off) // 8 + 1)
    offs = np.empty(cap, np.int64)
    lens = np.empty(cap, np.int32)
    tss = np.empty(cap, np.int64)
    missed = np.zeros(n_pages, np.int64)
    delta_mask = np.uint32((1 << delta_bits) - 1)
    n = 0
    for p in range(n_pages):
        base = p * page_size
        ts = np.int64(_u64(buf, base + ts_off))
        # The flags are C ints (1 << 31) added to a long: on 64-bit commits they arrive
        # sign-extended (0xffffffffc0000fc0 was seen), so only the low 32 bits count.
        commit = np.uint64(_u32(buf, base + commit_off))
        flags = commit & np.uint64(_RB_MISSED_MASK)
        size = np.int64(commit & np.uint64(0xFFFFF))  # a page is < 1 MiB; higher bits are flags
        start = base + data_off
        if size > page_size - data_off or (commit & ~np.uint64(_RB_MISSED_MASK)) != size:
            return offs, lens, tss, n, missed, base + commit_off, 1
        if flags & np.uint64(RB_MISSED_EVENTS):
            missed[p] = -1
            if flags & np.uint64(RB_MISSED_STORED) and size + 8 <= page_size - data_off:
                missed[p] = np.int64(_u64(buf, start + size))
        end = start + size
        i = start
        while i < end:
            if i + 4 > end:
                return offs, lens, tss, n, missed, i, 2
            word = _u32(buf, i)
            type_len = np.int64(word & np.uint32(0x1F))
            delta = np.int64((word >> np.uint32(5)) & delta_mask)
            if type_len == padding:
                if delta == 0:
                    break  # the rest of the page is empty
                if i + 8 > end:
                    return offs, lens, tss, n, missed, i, 2
                skip = np.int64(_u32(buf, i + 4))  # counts itself: a discarded event
                if skip < 4:
                    return offs, lens, tss, n, missed, i, 3
                i += 4 + skip
                continue
            if type_len == time_extend or type_len == time_stamp:
                if i + 8 > end:
                    return offs, lens, tss, n, missed, i, 2
                value = (np.int64(_u32(buf, i + 4)) << delta_bits) + delta
                if type_len == time_extend:
                    ts += value
                else:
                    # The stamp holds the low 59 bits; the top bits carry over (rb_fix_abs_ts).
                    high = ts & ~((np.int64(1) << (delta_bits + 32)) - 1)
                    ts = high | value
                i += 8
                continue
            if type_len == 0:
                if i + 8 > end:
                    return offs, lens, tss, n, missed, i, 2
                length = np.int64(_u32(buf, i + 4)) - 4
                if length < 0:
                    return offs, lens, tss, n, missed, i, 3
                length = (length + 3) & ~3
                payload = i + 8
            elif type_len <= data_max:
                length = type_len * 4
                payload = i + 4
            else:
                return offs, lens, tss, n, missed, i, 3
            if payload + length > end:
                return offs, lens, tss, n, missed, i, 2
            ts += delta
            offs[n] = payload
            lens[n] = length
            tss[n] = ts
            n += 1
            i = payload + length
    return offs, lens, tss, n, missed, -1, 0


_WALK_PROBLEMS = {
    1: "page commit size larger than the page",
    2: "event runs past the page's committed data",
    3: "event header with an invalid type or length",
}


@dataclass
class Decoded:
    """Events of the wanted types, each as a dict of numpy columns, plus the loss counts."""

    events: dict[str, dict[str, np.ndarray]]
    pages: int
    pages_with_missed: int
    missed_events: int  # lower bound: pages that lost an unknown number count 1


def walk(buf: np.ndarray, layout: PageLayout, header: EventHeader, source="ring buffer"):
    """Run `walk_pages` over whole pages, raising TraceFormatError on a malformed page."""
    if buf.size % layout.page_size:
        raise TraceFormatError(
            source, f"byte offset {buf.size - buf.size % layout.page_size}: "
                    f"truncated page ({buf.size % layout.page_size} of {layout.page_size} bytes)")
    offs, lens, tss, n, missed, bad, why = walk_pages(
        buf, layout.page_size, layout.ts_offset, layout.commit_offset, layout.commit_size,
        layout.data_offset, header.padding, header.time_extend, header.time_stamp,
        header.data_max, header.delta_bits)
    if bad >= 0:
        problem = _WALK_PROBLEMS[why]
        if why == 1:
            word = int.from_bytes(buf[bad:bad + layout.commit_size].tobytes(), "little")
            problem += f" (commit word {word:#x}, page size {layout.page_size})"
        raise TraceFormatError(source, f"byte offset {bad}: {problem}")
    return offs[:n], lens[:n], tss[:n], missed


def _gather(buf, offs, f: Field, dtype=None):
    """The field `f` of every event at payload offsets `offs`, as one numpy array."""
    idx = offs[:, None] + (f.offset + np.arange(f.size))
    raw = np.ascontiguousarray(buf[idx])
    if dtype is not None:
        return raw.view(dtype).reshape(len(offs))
    if f.size in (1, 2, 4, 8):
        kind = "i" if f.signed else "u"
        return raw.view(f"<{kind}{f.size}").reshape(len(offs))
    return raw.view(f"S{f.size}").reshape(len(offs))


def decode(buf: np.ndarray, layout: PageLayout, header: EventHeader,
           formats: dict[str, EventFormat], source="ring buffer") -> Decoded:
    """Decode pages into per-event columns: `ts` plus every fixed-size field of each format."""
    offs, lens, tss, missed = walk(buf, layout, header, source)
    events = {}
    if len(offs):
        any_format = next(iter(formats.values()))
        types = _gather(buf, offs, any_format.fields["common_type"])
    for name, fmt in formats.items():
        if not len(offs):
            events[name] = {"ts": np.empty(0, np.int64)}
            for fname, f in fmt.fields.items():
                events[name][fname] = _gather(buf, np.empty(0, np.int64), f)
            continue
        mask = types == fmt.id
        sel = offs[mask]
        needed = max((f.offset + f.size for f in fmt.fields.values()), default=0)
        short = lens[mask] < needed
        if short.any():
            where = int(sel[short.argmax()])
            raise TraceFormatError(source, f"byte offset {where}: {name} event shorter than its format")
        cols = {"ts": tss[mask]}
        for fname, f in fmt.fields.items():
            cols[fname] = _gather(buf, sel, f)
        events[name] = cols
    lost = missed[missed != 0]
    return Decoded(events, int(missed.size), int(lost.size),
                   int(np.where(lost < 0, 1, lost).sum()))


# ---------------------------------------------------------------------------------------
# The tracefs instance
# ---------------------------------------------------------------------------------------

TRACEFS_MOUNT = Path("/sys/kernel/tracing")


def find_tracefs() -> tuple[Path, bool]:
    """The tracefs root, mounting it at /sys/kernel/tracing if empty; (root, we mounted it)."""
    for root in (TRACEFS_MOUNT, Path("/sys/kernel/debug/tracing")):
        if (root / "instances").is_dir():
            return root, False
    if not TRACEFS_MOUNT.is_dir():
        raise CaptureError(f"{TRACEFS_MOUNT} does not exist; this kernel has no tracefs")
    done = subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS_MOUNT)],
                          capture_output=True, text=True)
    if done.returncode != 0 or not (TRACEFS_MOUNT / "instances").is_dir():
        raise CaptureError(f"cannot mount tracefs on {TRACEFS_MOUNT} ({done.stderr.strip()}); "
                           "capture needs root")
    return TRACEFS_MOUNT, True


def read_formats(root: Path) -> tuple[PageLayout, EventHeader, dict[str, EventFormat]]:
    """Page layout, event header, and the block and sleep event formats, as this kernel
    describes them (the sleep events only where it has syscall tracepoints)."""
    try:
        subbuf = root / "buffer_subbuf_size_kb"
        page_size = int(subbuf.read_text()) * 1024 if subbuf.exists() else None
        layout = parse_header_page((root / "events/header_page").read_text(), page_size)
        header = parse_header_event((root / "events/header_event").read_text())
        formats = {e: parse_format((root / "events/block" / e / "format").read_text()) for e in EVENTS}
    except OSError as exc:
        raise CaptureError(f"cannot read the block event formats from {root} ({exc}); "
                           "does this kernel have block tracepoints?") from None
    try:
        sleeps = {e: parse_format((root / "events/syscalls" / e / "format").read_text()) for e in SLEEP_EVENTS}
    except OSError:
        sleeps = {}
    return layout, header, formats | sleeps


def _write(path: Path, value) -> None:
    try:
        path.write_text(f"{value}\n")
    except OSError as exc:
        raise CaptureError(f"cannot write {value!r} to {path} ({exc.strerror})") from None


INSTANCE_PREFIX = "tracereplay-"


def remove_stale_instances(root: Path) -> list[str]:
    """Remove the `tracereplay-PID` instances whose process is gone, and say which, with the
    buffers each held: a capture killed with SIGKILL leaves its instance recording, with
    its kernel buffers (64 MiB a CPU), until the next boot. An instance whose pid is alive
    (its capture, or a process that reused the pid) is left alone."""
    removed = []
    for inst in sorted((root / "instances").glob(f"{INSTANCE_PREFIX}*")):
        pid = inst.name.removeprefix(INSTANCE_PREFIX)
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        try:
            held_kb = int((inst / "buffer_total_size_kb").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            held_kb = None
        try:
            (inst / "tracing_on").write_text("0\n")
        except OSError:
            pass
        if _rmdir_instance(inst) is None:
            held = f", which held {held_kb // 1024} MiB of kernel buffers" if held_kb else ""
            removed.append(f"{inst.name} (process {pid} is gone){held}")
    return removed


def _rmdir_instance(inst: Path) -> OSError | None:
    """rmdir a tracefs instance, waiting out EBUSY (a reader closing) for up to a second."""
    for attempt in range(50):
        try:
            inst.rmdir()
            return None
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno != errno.EBUSY or attempt == 49:
                return exc
            time.sleep(0.02)
    return None


def default_buffer_kb(ncpu: int) -> int:
    """64 MiB per CPU, or less so that all CPUs' buffers take at most a quarter of free memory."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail_kb = int(line.split()[1])
                return max(1024, min(DEFAULT_BUFFER_KB, avail_kb // (4 * max(ncpu, 1))))
    except OSError:
        pass
    return DEFAULT_BUFFER_KB


class TracefsSession:
    """A private instance tracing one device's block events; `stop` drains, `close` removes.

    Use as a context manager: the instance (with its filters and buffers) and a tracefs
    mount made for it are removed however the block ends.
    """

    def __init__(self, dev_t: int, buffer_kb: int | None = None, name: str | None = None):
        self.dev_t = dev_t
        self.name = name or f"{INSTANCE_PREFIX}{os.getpid()}"
        self.buffer_kb = buffer_kb
        self.root = None
        self.instance = None
        self.mounted = False
        self.pages: list[list[bytes]] = []
        self._fds: list[int] = []
        self._stop = threading.Event()
        self._thread = None
        self._error = None
        self.overruns = 0
        self.start_mono_ns = None
        self.removed_stale: list[str] = []  # instances of killed captures, removed by `open`

    def __enter__(self):
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def open(self):
        self.root, self.mounted = find_tracefs()
        self.layout, self.header, self.formats = read_formats(self.root)
        self.removed_stale = remove_stale_instances(self.root)
        self.instance = self.root / "instances" / self.name
        try:
            self.instance.mkdir()
        except OSError as exc:
            self.instance = None
            raise CaptureError(f"cannot create tracefs instance {self.name} ({exc.strerror}); "
                               "capture needs root") from None
        inst = self.instance
        cpus = sorted(int(p.name[3:]) for p in (inst / "per_cpu").glob("cpu[0-9]*"))
        _write(inst / "tracing_on", 0)
        _write(inst / "trace_clock", "mono")
        # The instance's page size can differ from the top-level one on newer kernels.
        subbuf = inst / "buffer_subbuf_size_kb"
        if subbuf.exists():
            self.layout = PageLayout(int(subbuf.read_text()) * 1024, self.layout.ts_offset,
                                     self.layout.commit_offset, self.layout.commit_size,
                                     self.layout.data_offset)
        _write(inst / "buffer_size_kb", self.buffer_kb or default_buffer_kb(len(cpus)))
        for event in EVENTS:
            _write(inst / "events/block" / event / "filter", f"dev == {self.dev_t}")
            _write(inst / "events/block" / event / "enable", 1)
        for event in SLEEP_EVENTS:
            if event in self.formats:
                _write(inst / "events/syscalls" / event / "enable", 1)
        for cpu in cpus:
            self._fds.append(os.open(inst / "per_cpu" / f"cpu{cpu}" / "trace_pipe_raw",
                                     os.O_RDONLY | os.O_NONBLOCK))
            self.pages.append([])
        self.cpus = cpus

    def start(self):
        self._thread = threading.Thread(target=self._read_loop, name="tracefs-reader", daemon=True)
        self._thread.start()
        self.start_mono_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        _write(self.instance / "tracing_on", 1)

    def _drain_once(self) -> int:
        got = 0
        size = self.layout.page_size
        for fd, pages in zip(self._fds, self.pages):
            while True:
                try:
                    page = os.read(fd, size)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.EINTR:
                        continue
                    raise
                if not page:
                    break
                if len(page) < size:
                    page = page + bytes(size - len(page))
                pages.append(page)
                got += 1
        return got

    def _read_loop(self):
        try:
            while not self._stop.is_set():
                if not self._drain_once():
                    self._stop.wait(_IDLE_SLEEP_S)
        except BaseException as exc:  # reported by stop(), in the main thread
            self._error = exc

    def stop(self):
        """Stop tracing, then read every page left in the buffers."""
        if self.instance is None:
            return
        _write(self.instance / "tracing_on", 0)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise CaptureError(f"reading the trace buffers failed ({self._error})")
        while self._drain_once():
            pass
        self.overruns = 0
        for cpu in self.cpus:
            stats = (self.instance / "per_cpu" / f"cpu{cpu}" / "stats").read_text()
            for key in ("overrun", "dropped events"):
                m = re.search(rf"^{key}:\s*(\d+)", stats, re.M)
                if m:
                    self.overruns += int(m[1])

    def decode(self) -> Decoded:
        """Decode every page read, per CPU, into one Decoded with events in time order."""
        parts = []
        for cpu, pages in zip(self.cpus, self.pages):
            buf = np.frombuffer(b"".join(pages), dtype=np.uint8)
            parts.append(decode(buf, self.layout, self.header, self.formats, f"cpu{cpu} trace_pipe_raw"))
        events = {}
        for name in self.formats:
            cols = [p.events[name] for p in parts]
            merged = {k: np.concatenate([c[k] for c in cols]) for k in cols[0]}
            order = np.argsort(merged["ts"], kind="stable")
            events[name] = {k: v[order] for k, v in merged.items()}
        return Decoded(events, sum(p.pages for p in parts), sum(p.pages_with_missed for p in parts),
                       sum(p.missed_events for p in parts))

    def close(self):
        """Remove everything `open` set up; safe to call more than once and after a failure."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        if self.instance is not None:
            try:
                _write(self.instance / "tracing_on", 0)
            except CaptureError:
                pass
            exc = _rmdir_instance(self.instance)
            if exc is not None:
                raise CaptureError(f"cannot remove tracefs instance {self.instance} "
                                   f"({exc.strerror}); remove it with rmdir") from None
            self.instance = None
        if self.mounted:
            subprocess.run(["umount", str(self.root)], capture_output=True)
            self.mounted = False
