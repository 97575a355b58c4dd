"""Dependencies and think time, inferred from a captured block trace, for causal replay.

For each I/O: up to two parents (the I/Os it waited for, as rows back, 0 = none), its think
time (the application's own time between the last parent's completion and its issue), and the
op of that last parent, so a replayer can take its own time per hop off the think time. A
capture's recorded sleeps make a process's sleep between two of its I/Os a wait for the other
process's I/O that ended it, not time of its own.
Streams by chunks with a small carried state, so a trace of any length is annotated in
bounded memory, and the same trace always gives the same annotation. The per-row pass is a
Numba kernel in analysis.causal_kernel, loaded on first use.
"""
from dataclasses import dataclass, field

import numpy as np

from traces.errors import TraceFormatError
from traces.schema import Flag, Op

# A parent further back than this many rows is dropped (the I/O keeps its captured time): the
# engine keeps the completion times of this many recent rows, no more.
MAX_BACK = (1 << 16) - 1

# Group ids for the kernel's own threads: every writeback worker is one group (kworker/u8:4
# and kworker/u8:17 are interchangeable pool workers), every journal thread another.
WRITEBACK, JOURNAL = -1, -2

# parent2 of a flush issued when nothing was in flight: it waits for every earlier I/O.
BARRIER = -1
# Completions remembered for a process that slept: the one it woke after is among them.
RECENT = 64

HEURISTICS = {
    "chains": "per-process chains: an I/O waits for the last I/O of its own process (writeback "
              "workers one process, journal threads another) that completed before it was issued; "
              "a process's first I/O for the last I/O of any process completed before it",
    "recent": "hfplayer-like: an I/O waits for the last I/O of any process that completed at most "
              "1 ms before it was issued; none: it keeps its captured time",
    "hybrid": "chains, and also the last I/O of any process if it completed later than the "
              "chain's parent and at most 2 ms before (10 ms after a journal, writeback, flush or "
              "FUA I/O or before a journal I/O; any time before a writeback I/O): waits on other "
              "processes (the journal commit an fsync waits for, another transaction's WAL flush, "
              "the writes a commit or writeback follows)",
}
WINDOWS_NS = {"chains": 0, "recent": 1_000_000, "hybrid": 2_000_000}
# hybrid: a wait on the journal, writeback or a flush (an fsync's commit), and the journal's
# wait for the writes it commits, end this long before the next I/O at most; a wake-up by
# another process's I/O, the window above. Writeback waits for what any process did last
# however long before (analysis.causal_kernel).
DURABLE_WINDOW_NS = 10_000_000
# Chosen by measured error (bench/causal.py: four applications run for real on a fast and a
# slow drive, each capture replayed on the other): mean |error| hybrid 14 %, chains 64 %,
# recent 246 %; original timing 255 %, as fast as possible 55 %. With the sleeps
# (docs/benchmarks.md's seventh set): hybrid 11 %, chains 72 %, recent 249 %; original 270 %, afap 56 %.
DEFAULT_HEURISTIC = "hybrid"
REQUIRED = ("pid", "latency_ns")
COLUMNS = ("ts_ns", "op", "latency_ns", "pid", "comm", "flags")


def check_columns(path, column_names) -> None:
    """Causal replay needs who issued each I/O and how long it took; refuse a trace without."""
    missing = [c for c in REQUIRED if c not in column_names]
    if missing:
        raise TraceFormatError(path, f"causal timing needs the column{'s' if len(missing) > 1 else ''} "
                               f"{' and '.join(missing)}, which this trace lacks (imported traces often "
                               "do); capture one with `replay capture` or `replay capture recipe`",
                               missing[0])


def groups_of(pid: np.ndarray, comm) -> np.ndarray:
    """Each row's chain group: its pid, or WRITEBACK / JOURNAL for the kernel's threads."""
    group = pid.astype(np.int64)
    if comm is not None and len(comm):
        names, inverse = np.unique(np.asarray(comm, dtype=object).astype(str), return_inverse=True)
        kind = np.array([WRITEBACK if n.startswith("kworker") else JOURNAL if n.startswith("jbd2") else 0
                         for n in names], dtype=np.int64)[inverse]
        group = np.where(kind != 0, kind, group)
    return group


class Sleeps:
    """When each row's process last woke from a sleep since its previous I/O (-1: it did not
    sleep), from a capture's `sleeps` (source metadata), row by row across chunks."""

    def __init__(self, sleeps: dict | None):
        self.by_pid = {}
        if sleeps:
            pid, start, end = (np.asarray(sleeps[k], np.int64) for k in ("pid", "start_ns", "end_ns"))
            for p in np.unique(pid):
                self.by_pid[int(p)] = start[pid == p], end[pid == p]
        self.previous = {}  # pid: its last I/O's issue time so far

    def woke(self, pid: np.ndarray, ts: np.ndarray) -> np.ndarray:
        out = np.full(len(ts), -1, np.int64)
        if not self.by_pid:
            return out
        for p in np.unique(pid).tolist():
            rows = np.flatnonzero(pid == p)
            t = ts[rows]
            before = np.concatenate([[self.previous.get(p, np.iinfo(np.int64).min)], t[:-1]])
            self.previous[p] = int(t[-1])
            if p not in self.by_pid:
                continue
            start, end = self.by_pid[p]
            last = np.searchsorted(end, t, side="right") - 1  # the last sleep ended by the I/O
            slept = (last >= 0) & (start[np.maximum(last, 0)] >= before)
            out[rows[slept]] = end[last[slept]]
        return out


class Annotator:
    """Annotates a trace chunk by chunk, in order: `add(chunk)` returns the chunk's parent,
    parent2 (int32 rows back, 0: none), think_ns (int64), from_op (int8, the op of the
    parent the think time runs from; -1: none) and woken (uint8, 1: the row waits for the I/O
    that ended its process's sleep) columns.

    `host_ns[a, b]`, when given (replay.calibrate), is the replayer's own time between an op
    `a` completing and an op `b` that waited for it reaching the device: its reaping and
    submission, which the captured think time already holds as the application's own. It is
    taken off each think time (down to 0), so a chain replays at the captured pace.

    `sleeps` (a capture's source metadata, traces.capture.records.sleeps), when given, turns a
    process's sleep between two of its I/Os into a wait for another process's I/O: see
    `analysis.causal_kernel.annotate_kernel`."""

    def __init__(self, heuristic: str = DEFAULT_HEURISTIC, window_ns: int | None = None,
                 max_back: int = MAX_BACK, host_ns: np.ndarray | None = None, sleeps: dict | None = None):
        if heuristic not in HEURISTICS:
            raise ValueError(f"unknown heuristic {heuristic!r}: use one of {', '.join(HEURISTICS)}")
        self.heuristic, self.max_back = heuristic, int(max_back)
        self.window_ns = int(WINDOWS_NS[heuristic] if window_ns is None else window_ns)
        self.host_ns = None if host_ns is None else np.asarray(host_ns, np.int64).reshape(4, 4)
        # Numba loads here, on first use, not with this module (the CLI's choices import it).
        from analysis.causal_kernel import annotate_kernel, new_state

        self.kernel = annotate_kernel
        self.state = new_state()
        self.rows = 0
        self.sleeps = Sleeps(sleeps)

    def add(self, chunk: dict) -> dict:
        n = len(chunk["ts_ns"])
        out = {"parent": np.zeros(n, np.int32), "parent2": np.zeros(n, np.int32),
               "think_ns": np.zeros(n, np.int64), "from_op": np.zeros(n, np.int8), "woken": np.zeros(n, np.uint8)}
        flags = chunk.get("flags")
        # The kernel takes C-contiguous columns (a copy only of a strided one).
        flags = np.zeros(n, np.uint8) if flags is None else np.ascontiguousarray(flags, np.uint8)
        group = groups_of(np.asarray(chunk["pid"]), chunk.get("comm"))
        op = np.ascontiguousarray(chunk["op"], np.uint8)
        ts = np.ascontiguousarray(chunk["ts_ns"], np.int64)
        self.kernel(self.rows, ts, op, np.ascontiguousarray(chunk["latency_ns"], np.int64), group, flags,
                        self.sleeps.woke(np.asarray(chunk["pid"]), ts),
                        list(HEURISTICS).index(self.heuristic), self.window_ns, self.max_back, *self.state,
                        out["parent"], out["parent2"], out["think_ns"], out["from_op"], out["woken"])
        self.rows += n
        if self.host_ns is not None:
            waits = out["from_op"] >= 0
            cost = self.host_ns[out["from_op"][waits], op[waits]]
            out["think_ns"][waits] = np.maximum(out["think_ns"][waits] - cost, 0)
        return out


def annotate(columns: dict, heuristic: str = DEFAULT_HEURISTIC, window_ns: int | None = None,
             sleeps: dict | None = None) -> dict:
    """The whole annotation of an in-memory trace (columns as numpy arrays)."""
    return Annotator(heuristic, window_ns, sleeps=sleeps).add(columns)


def sleeps_of(metadata: dict) -> dict | None:
    """The sleeps a capture recorded (None for other traces)."""
    return (metadata.get("source") or {}).get("sleeps")


@dataclass
class CausalSummary:
    """What `replay traces show` reports about the inferred dependencies."""

    heuristic: str = DEFAULT_HEURISTIC
    ios: int = 0
    roots: int = 0  # I/Os that wait for nothing: replayed at their captured time
    chained: int = 0  # I/Os that wait for a parent
    flush_waits: int = 0  # flushes and FUA writes that wait for a parent
    sleeps: int | None = None  # sleeps the capture recorded (None: it did not record them)
    woken: int = 0  # I/Os that wait for the I/O that ended their process's sleep
    chains: int = 0  # groups (processes; writeback and journal threads one each) with a chained I/O
    think_ns: dict = field(default_factory=dict)  # percentiles of the chained I/Os' think time
    think_total_ns: int = 0
    device_total_ns: int = 0  # sum of captured latency, for scale

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


PERCENTILES = (50.0, 90.0, 99.0)
_THINK_BINS = np.concatenate([[0], np.logspace(2, 11, 271)]).astype(np.int64)  # 100 ns .. 100 s


def summarise(trace, heuristic: str = DEFAULT_HEURISTIC, window_ns: int | None = None,
              rows: int | None = None) -> CausalSummary | None:
    """The annotation of a TraceFile summarised (streaming); None when it cannot be annotated."""
    if any(c not in trace.column_names for c in REQUIRED):
        return None
    cols = [c for c in COLUMNS if c in trace.column_names]
    sleeps = sleeps_of(trace.metadata)
    ann = Annotator(heuristic, window_ns, sleeps=sleeps)
    s = CausalSummary(heuristic=heuristic, sleeps=None if sleeps is None else len(sleeps["pid"]))
    hist = np.zeros(len(_THINK_BINS), np.int64)
    groups = set()
    for chunk in trace.chunks(columns=cols, rows=rows):
        a = ann.add(chunk)
        chained = (a["parent"] > 0) | (a["parent2"] != 0)
        s.ios += len(chained)
        s.chained += int(chained.sum())
        s.flush_waits += int((chained & _flushlike(chunk)).sum())
        s.woken += int(a["woken"].sum())
        th = a["think_ns"][chained]
        s.think_total_ns += int(th.sum())
        hist += np.bincount(np.searchsorted(_THINK_BINS, th, side="right") - 1, minlength=len(hist))[:len(hist)]
        s.device_total_ns += int(np.clip(chunk["latency_ns"], 0, None).sum())
        groups.update(np.unique(groups_of(np.asarray(chunk["pid"]), chunk.get("comm"))[chained]).tolist())
    s.roots = s.ios - s.chained
    s.chains = len(groups)
    if s.chained:
        cum = np.cumsum(hist)
        for q in PERCENTILES:
            i = int(np.searchsorted(cum, q / 100 * s.chained))
            s.think_ns[f"p{q:g}"] = int(_THINK_BINS[min(i + 1, len(_THINK_BINS) - 1)])
        s.think_ns["mean"] = s.think_total_ns // s.chained
    return s


def _flushlike(chunk):
    op = np.asarray(chunk["op"])
    flags = chunk.get("flags")
    fua = (op == Op.WRITE) & ((np.asarray(flags) & Flag.FUA) != 0) if flags is not None else False
    return (op == Op.FLUSH) | fua


def format_text(s: CausalSummary, fmt_ns) -> list[str]:
    """Lines for `replay traces show`."""
    if s is None:
        return ["causal          - (needs the pid and latency_ns columns: capture with `replay capture`)"]
    share = f"{100 * s.think_total_ns / (s.think_total_ns + s.device_total_ns):.0f}%" \
        if s.think_total_ns + s.device_total_ns else "-"
    return [
        f"causal          {s.heuristic}: {s.chained:,} I/Os wait for a parent in {s.chains} chains, "
        f"{s.roots:,} roots keep their captured time; {s.flush_waits:,} flushes/FUA writes wait for "
        "the writes before them",
        "think time      " + (", ".join(f"{k} {fmt_ns(v)}" for k, v in s.think_ns.items()) or "-")
        + f"; total {fmt_ns(s.think_total_ns)} ({share} of think + captured device time)",
    ] + ([] if s.sleeps is None else [
        f"sleeps          {s.sleeps:,} recorded; {s.woken:,} I/Os after one wait for the other process's "
        "I/O that ended it, not for the sleep"])
