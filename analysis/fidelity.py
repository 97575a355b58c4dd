"""Replay fidelity: how closely a replay followed its trace, by the measures of REFERENCE.md
section 3 (issue error, inter-arrival error, in-flight error, ordering, latency error and the
aggregate errors), streamed over a results file's row groups in bounded memory.
"""
import math
from dataclasses import dataclass, field

import numba
import numpy as np

from analysis.histogram import LatencyHistogram, bin_lower, bin_width
from traces.schema import RESULT_COLUMNS, TRACE_COLUMNS, Op

_COLUMNS = ("ts_ns", "op", "length", "intended_ns", "issue_ns", "complete_ns", "result")
assert all(name in TRACE_COLUMNS or name in RESULT_COLUMNS for name in _COLUMNS)
LATENCY = "latency_ns"
PERCENTILES = (50.0, 99.0, 99.9)
# Issue-error bounds whose shares are reported: Buttress's 100 us, and one decade either side.
BOUNDS_NS = (10_000, 100_000, 1_000_000)
_NEVER = np.iinfo(np.int64).max  # a captured I/O still in flight when the capture ended
_READ_ROWS = 1 << 20  # rows per chunk: fewer Python round trips than the reader's default


class SignedHistogram:
    """Counts of signed int64 values (errors can be early or late): non-negative values in
    one LatencyHistogram, negated negative ones in another; percentiles are nearest-rank over
    both, within 1/256 relative like LatencyHistogram's."""

    def __init__(self, bounds=()):
        self.neg, self.pos = LatencyHistogram(), LatencyHistogram()
        self.bounds = tuple(int(b) for b in bounds)
        self.within = [0] * len(self.bounds)

    def add(self, values):
        values = np.asarray(values, dtype=np.int64)
        if not values.size:
            return
        negative = values < 0
        self.neg.add(-values[negative])
        self.pos.add(values[~negative])
        if self.bounds:
            magnitude = np.abs(values)
            for j, b in enumerate(self.bounds):
                self.within[j] += int(np.count_nonzero(magnitude <= b))

    @property
    def count(self):
        return self.neg.count + self.pos.count

    @property
    def mean(self):
        n = self.count
        return (self.pos.sum - self.neg.sum) / n if n else None

    @property
    def min(self):
        if self.neg.count:
            return -self.neg.max
        return self.pos.min

    @property
    def max(self):
        if self.pos.count:
            return self.pos.max
        return -self.neg.min if self.neg.count else None

    def at_rank(self, rank):
        """The rank-th smallest value (1-based), as LatencyHistogram reports a percentile."""
        nn = self.neg.count
        if rank <= nn:
            return -_at_rank(self.neg, nn - rank + 1)
        return _at_rank(self.pos, rank - nn)

    def percentiles(self, qs):
        n = self.count
        if not n:
            return [None] * len(qs)
        return [self.at_rank(min(max(math.ceil(n * (float(q) / 100.0)), 1), n)) for q in qs]

    def to_dict(self):
        n = self.count
        out = {"count": n, "mean": self.mean, "min": self.min, "max": self.max}
        for q, v in zip(PERCENTILES, self.percentiles(PERCENTILES)):
            out[f"p{q:g}"] = v
        if self.bounds:
            out["within"] = {_human(b): (w / n if n else None) for b, w in zip(self.bounds, self.within)}
        return out


def _at_rank(h: LatencyHistogram, rank):
    n = h.count
    if rank <= 1:
        return h.min
    if rank >= n:
        return h.max
    i = int(np.searchsorted(np.cumsum(h.counts), rank, side="left"))
    mid = int(bin_lower(i)) + (int(bin_width(i)) - 1) // 2
    return min(max(mid, h.min), h.max)


def _human(ns):
    return f"{ns // 1000}us" if ns < 1_000_000 else f"{ns // 1_000_000}ms"


# ---- kernels --------------------------------------------------------------------------------


@numba.njit(nogil=True, cache=True, inline="always")
def _heap_push(heap, size, v):
    i = size
    heap[i] = v
    while i > 0:
        parent = (i - 1) >> 1
        if heap[parent] <= heap[i]:
            break
        heap[parent], heap[i] = heap[i], heap[parent]
        i = parent
    return size + 1


@numba.njit(nogil=True, cache=True, inline="always")
def _heap_pop(heap, size):
    size -= 1
    heap[0] = heap[size]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        child = left
        if left + 1 < size and heap[left + 1] < heap[left]:
            child = left + 1
        if heap[i] <= heap[child]:
            break
        heap[i], heap[child] = heap[child], heap[i]
        i = child
    return size


@numba.njit(nogil=True, cache=True)
def inflight_at_starts(start, end, heap, size, out):
    """For intervals [start[i], end[i]) taken in order of non-decreasing start, out[i] = how many
    earlier intervals are still open at start[i] (end > start[i]). `heap` (a min-heap of open
    ends, `size` of them) carries across calls. Returns (rows done, new size): fewer rows than
    given when the heap is full; the caller grows it and calls again from there."""
    for i in range(start.shape[0]):
        t = start[i]
        while size > 0 and heap[0] <= t:
            size = _heap_pop(heap, size)
        out[i] = size
        if size == heap.shape[0]:
            return i, size
        size = _heap_push(heap, size, end[i])
    return start.shape[0], size


@numba.njit(nogil=True, cache=True)
def count_reordered(seq, max_seen):
    """RFC 4737 reordering over I/Os taken in issue order: an I/O is reordered when its trace
    position `seq` is below the highest one issued before it. Returns (count, new max_seen)."""
    n = 0
    for i in range(seq.shape[0]):
        if seq[i] < max_seen:
            n += 1
        else:
            max_seen = seq[i]
    return n, max_seen


@numba.njit(nogil=True, cache=True)
def is_sorted(a):
    for i in range(1, a.shape[0]):
        if a[i] < a[i - 1]:
            return False
    return True


class _OpenIntervals:
    """In-flight counting across chunks with a growable heap of open interval ends."""

    def __init__(self):
        self.heap = np.empty(1024, np.int64)
        self.size = 0

    def counts(self, start, end):
        out = np.empty(len(start), np.int64)
        done = 0
        while done < len(start):
            n, self.size = inflight_at_starts(start[done:], end[done:], self.heap, self.size, out[done:])
            done += n
            if done < len(start):
                self.heap = np.concatenate([self.heap, np.empty(len(self.heap), np.int64)])
        return out


# ---- the measure ----------------------------------------------------------------------------


@dataclass
class Fidelity:
    """How closely a replay followed its trace (REFERENCE.md section 3, with T(i), the intended
    issue time, = the run's start + (t_o(i) - t_o(0)) / speed, stored as `intended_ns`):

    - issue_error: t_r(i) - T(i), signed (negative = issued early); p50, p99, p99.9, max, mean
      and the share within 10 us, 100 us and 1 ms.
    - inter_arrival_error: (t_r(i) - t_r(i-1)) - (t_o(i) - t_o(i-1)) / speed, consecutive
      issued I/Os in trace order.
    - inflight: replayed in-flight count at each issue (I/Os issued earlier and not complete),
      its mean, and when the trace carries latency_ns the captured in-flight at each trace
      time (earlier I/Os with t_o + latency_ns after it) and the error replayed - captured.
    - ordering: I/Os issued out of trace order, RFC 4737 style: in issue order, an I/O whose
      trace position is below the highest issued before it (ties in issue time keep trace
      order). Reordering is assumed not to span more than one chunk of a million rows.
    - latency (trace with latency_ns): latency error = replayed device latency
      (complete - issue) - captured latency_ns per I/O, and the ratio replayed / captured of
      the percentiles.
    - aggregate: relative error (replay / trace - 1) of IOPS, MB/s, run time and read share;
      rates and run time only for original timing (`timed`), where the trace sets them.
    Closed-loop (afap) runs have no schedule: their timing errors are computed but say nothing.
    """

    mode: str
    speed: float
    timed: bool
    rows: int
    issued: int
    issue_error: dict
    inter_arrival_error: dict
    inflight: dict
    ordering: dict
    latency: dict | None
    aggregate: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "mode": self.mode, "speed": self.speed, "timed": self.timed, "rows": self.rows,
            "issued": self.issued, "issue_error_ns": self.issue_error,
            "inter_arrival_error_ns": self.inter_arrival_error, "inflight": self.inflight,
            "ordering": self.ordering, "latency": self.latency, "aggregate": self.aggregate,
        }


class FidelityBuilder:
    """Streams results chunks (in trace order) into a Fidelity; `add` each, then `finish`."""

    def __init__(self, speed=1.0, mode="original", with_latency=False):
        self.speed = float(speed)
        self.mode = mode
        self.with_latency = with_latency
        self.issue_error = SignedHistogram(BOUNDS_NS)
        self.inter_arrival = SignedHistogram(BOUNDS_NS)
        self.inflight_error = SignedHistogram()
        self.latency_error = SignedHistogram()
        self.replayed_latency = LatencyHistogram()
        self.captured_latency = LatencyHistogram()
        self.rows = 0
        self.issued = 0
        self.reordered = 0
        self._max_seq = -1
        self._prev = None  # (issue_ns, ts_ns) of the last issued row, for inter-arrival
        self._captured = _OpenIntervals()
        self._replayed = _OpenIntervals()
        self._pending = None  # issued rows not yet taken in issue order: (issue, complete, seq, cap)
        self._inflight_sum = 0
        self._captured_sum = 0
        self._first_ts = self._last_ts = None
        self._trace_bytes = 0
        self._trace_reads = 0
        self._start = self._end = None
        self._bytes = 0
        self._reads = 0

    def add(self, chunk) -> None:
        needed = _COLUMNS + ((LATENCY,) if self.with_latency else ())
        missing = [name for name in needed if name not in chunk]
        if missing:
            raise ValueError(f"result chunk lacks column(s) {missing}; it needs {list(needed)}")
        ts, length, intended, issue, complete, result = (
            np.ascontiguousarray(chunk[n], dtype=np.int64)
            for n in ("ts_ns", "length", "intended_ns", "issue_ns", "complete_ns", "result"))
        op = np.asarray(chunk["op"])
        n = len(ts)
        if not n:
            return
        seq = np.arange(self.rows, self.rows + n, dtype=np.int64)
        self.rows += n
        # The trace as captured.
        if self._first_ts is None:
            self._first_ts = int(ts[0])
        self._last_ts = int(ts[-1])
        transfer = (op == Op.READ) | (op == Op.WRITE)
        self._trace_bytes += int(length[transfer].sum())
        self._trace_reads += int(np.count_nonzero(op == Op.READ))
        captured_inflight = None
        if self.with_latency:
            latency = np.ascontiguousarray(chunk[LATENCY], dtype=np.int64)
            ends = np.where(latency >= 0, ts + np.maximum(latency, 0), _NEVER)
            captured_inflight = self._captured.counts(ts, ends)
        # The replay.
        issued = issue >= 0
        if not issued.all():
            ts, op, length, intended, issue, complete, result, seq = (
                a[issued] for a in (ts, op, length, intended, issue, complete, result, seq))
            if captured_inflight is not None:
                captured_inflight = captured_inflight[issued]
            if self.with_latency:
                latency = latency[issued]
        if not len(ts):
            return
        self.issued += len(ts)
        first = int(np.minimum(intended, issue).min())
        self._start = first if self._start is None else min(self._start, first)
        last = int(complete.max())
        self._end = last if self._end is None else max(self._end, last)
        self._bytes += int(result[result > 0].sum())
        self._reads += int(np.count_nonzero(op == Op.READ))
        self.issue_error.add(issue - intended)
        prev_issue = np.concatenate([[self._prev[0]], issue[:-1]]) if self._prev else issue[:-1]
        prev_ts = np.concatenate([[self._prev[1]], ts[:-1]]) if self._prev else ts[:-1]
        cur = slice(0, None) if self._prev else slice(1, None)
        gaps = (issue[cur] - prev_issue) - np.rint((ts[cur] - prev_ts) / self.speed).astype(np.int64)
        self.inter_arrival.add(gaps)
        self._prev = (int(issue[-1]), int(ts[-1]))
        if self.with_latency:
            known = latency >= 0
            self.replayed_latency.add((complete - issue)[known])
            self.captured_latency.add(latency[known])
            self.latency_error.add((complete - issue)[known] - latency[known])
        cap = captured_inflight if captured_inflight is not None else np.zeros(len(issue), np.int64)
        self._take_in_issue_order(issue, complete, seq, cap, final=False)

    def _take_in_issue_order(self, issue, complete, seq, cap, final):
        """Rows reach here in trace order; in-flight at issue and ordering need issue order.

        Rows issued before this chunk's earliest issue are taken now, in issue order; the rest
        wait for the next chunk, on the assumption that no row later in the trace is issued
        before that earliest issue (reordering spans less than a chunk).
        """
        threshold = int(issue.min()) if len(issue) else None
        if self._pending is not None:
            issue, complete, seq, cap = (np.concatenate([p, a]) for p, a in
                                         zip(self._pending, (issue, complete, seq, cap)))
        self._pending = None
        if not len(issue):
            return
        if not is_sorted(issue):
            order = np.lexsort((seq, issue))
            issue, complete, seq, cap = issue[order], complete[order], seq[order], cap[order]
        cut = len(issue) if final or threshold is None else int(np.searchsorted(issue, threshold))
        if cut < len(issue):
            self._pending = (issue[cut:], complete[cut:], seq[cut:], cap[cut:])
        if cut == 0:
            return
        issue, complete, seq, cap = issue[:cut], complete[:cut], seq[:cut], cap[:cut]
        replayed = self._replayed.counts(issue, complete)
        self._inflight_sum += int(replayed.sum())
        self._captured_sum += int(cap.sum())
        if self.with_latency:
            self.inflight_error.add(replayed - cap)
        n, self._max_seq = count_reordered(seq, self._max_seq)
        self.reordered += int(n)

    def finish(self) -> Fidelity:
        if self._pending is not None:
            empty = np.zeros(0, np.int64)
            self._take_in_issue_order(empty, empty, empty, empty, final=True)
        issued = self.issued
        inflight = {
            "replayed_mean": self._inflight_sum / issued if issued else None,
            "captured_mean": (self._captured_sum / issued if issued else None) if self.with_latency else None,
            "error": self.inflight_error.to_dict() if self.with_latency else None,
        }
        latency = None
        if self.with_latency:
            rep = self.replayed_latency.percentiles(PERCENTILES)
            cap = self.captured_latency.percentiles(PERCENTILES)
            ratio = {f"p{q:g}": (r / c if r is not None and c else None)
                     for q, r, c in zip(PERCENTILES, rep, cap)}
            rm, cm = self.replayed_latency.mean, self.captured_latency.mean
            ratio["mean"] = rm / cm if rm is not None and cm else None
            latency = {
                "error_ns": self.latency_error.to_dict(),
                "replayed_ns": {f"p{q:g}": v for q, v in zip(PERCENTILES, rep)} | {"mean": rm},
                "captured_ns": {f"p{q:g}": v for q, v in zip(PERCENTILES, cap)} | {"mean": cm},
                "ratio": ratio,
            }
        timed = self.mode != "afap"
        return Fidelity(
            mode=self.mode, speed=self.speed, timed=timed, rows=self.rows, issued=issued,
            issue_error=self.issue_error.to_dict(), inter_arrival_error=self.inter_arrival.to_dict(),
            inflight=inflight,
            ordering={"reordered": self.reordered, "share": self.reordered / issued if issued else None},
            latency=latency, aggregate=self._aggregate(timed),
        )

    def _aggregate(self, timed):
        trace_s = ((self._last_ts - self._first_ts) / self.speed / 1e9) if self._first_ts is not None else 0.0
        run_s = (self._end - self._start) / 1e9 if self._start is not None else 0.0

        def entry(trace, replay):
            rel = replay / trace - 1 if trace and replay is not None else None
            return {"trace": trace, "replay": replay, "relative_error": rel}

        out = {"read_share": entry(self._trace_reads / self.rows if self.rows else None,
                                   self._reads / self.issued if self.issued else None)}
        if timed:
            out["run_time_s"] = entry(trace_s, run_s)
            out["iops"] = entry(self.rows / trace_s if trace_s else 0.0,
                                self.issued / run_s if run_s else 0.0)
            out["mb_per_s"] = entry(self._trace_bytes / trace_s / 1e6 if trace_s else 0.0,
                                    self._bytes / run_s / 1e6 if run_s else 0.0)
        return out


def fidelity(results, rows=_READ_ROWS) -> Fidelity:
    """The fidelity of one replay (an analysis.results.Results) to its trace, in one streamed pass."""
    with_latency = results.has(LATENCY)
    builder = FidelityBuilder(speed=results.speed, mode=results.run.get("mode", "original"),
                              with_latency=with_latency)
    columns = list(_COLUMNS) + ([LATENCY] if with_latency else [])
    for chunk in results.chunks(columns, rows=rows):
        builder.add(chunk)
    return builder.finish()
