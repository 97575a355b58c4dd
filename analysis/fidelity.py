"""Replay fidelity: how closely a replay followed its trace, by the measures of docs/results.md
(issue error, inter-arrival error, in-flight error, ordering, latency error and the
aggregate errors), streamed over a results file's row groups in bounded memory.
"""
import math
from dataclasses import dataclass, field

import numba
import numpy as np

from analysis.histogram import LatencyHistogram, bin_index, bin_mid
from traces.kernel_types import F64, I64, U8, ro_c, rw
from traces.schema import RESULT_COLUMNS, TRACE_COLUMNS, Op

_COLUMNS = ("ts_ns", "op", "length", "intended_ns", "issue_ns", "complete_ns", "result")
assert all(name in TRACE_COLUMNS or name in RESULT_COLUMNS for name in _COLUMNS)
LATENCY = "latency_ns"
PERCENTILES = (50.0, 99.0, 99.9)
# Issue-error bounds whose shares are reported: Buttress's 100 us, and one decade either side.
BOUNDS_NS = (10_000, 100_000, 1_000_000)
_NEVER = np.iinfo(np.int64).max  # a captured I/O still in flight when the capture ended
_INT64_MIN = np.iinfo(np.int64).min
# Rows per chunk: fewer Python round trips than the reader's default of 65,536, and half the
# writer's row group, which peaked at 650 MB RSS against ~510 (decode buffers, temporaries).
_READ_ROWS = 1 << 19
_READ, _WRITE = int(Op.READ), int(Op.WRITE)
# Moves an insertion sort may make per row before the chunk is sorted by NumPy instead.
_SORT_BUDGET = 32


class SignedHistogram:
    """Counts of signed int64 values (errors can be early or late): non-negative values in
    one LatencyHistogram, negated negative ones in another; percentiles are nearest-rank over
    both, within 1/256 relative like LatencyHistogram's."""

    def __init__(self, bounds=()):
        self.neg, self.pos = LatencyHistogram(), LatencyHistogram()
        self.bounds = tuple(int(b) for b in bounds)
        self.within = [0] * len(self.bounds)
        self._bounds = np.sort(np.array(self.bounds, np.int64))

    def add(self, values):
        values = np.ascontiguousarray(values, dtype=np.int64)
        if not values.size:
            return
        if values.min() == _INT64_MIN:
            raise ValueError("value -2**63 has no int64 magnitude; errors must be within int64")
        above = np.zeros(len(self.bounds) + 1, np.int64)
        neg, pos = _signed_add(values, self.neg.counts, self.pos.counts, self._bounds, above)
        for h, (n, mean, m2, lo, hi) in ((self.neg, neg), (self.pos, pos)):
            if n:
                h.combine(int(n), float(mean), float(m2), int(lo), int(hi))
        within = np.cumsum(above)
        for j, b in enumerate(self.bounds):
            self.within[j] += int(within[np.searchsorted(self._bounds, b)])

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
    mid = int(bin_mid(i))
    return min(max(mid, h.min), h.max)


def _human(ns):
    return f"{ns // 1000}us" if ns < 1_000_000 else f"{ns // 1_000_000}ms"


# ---- kernels --------------------------------------------------------------------------------


@numba.njit((I64, F64, F64, F64, I64, I64), nogil=True, cache=True, inline="always")
def _side(k, ref, s, sq, lo, hi):
    if k == 0:
        return k, 0.0, 0.0, lo, hi
    return k, ref + s / k, max(sq - s * s / k, 0.0), lo, hi


@numba.njit((ro_c(I64), rw(I64), rw(I64), ro_c(I64), rw(I64)), nogil=True, cache=True)
def _signed_add(values, neg_counts, pos_counts, bounds, above):
    """One pass of SignedHistogram.add: |v| counted into neg_counts (v < 0) or pos_counts, and
    above[j] += how many |v| exceed exactly j of the ascending `bounds` (len(bounds) + 1
    entries; their cumulative sums are the counts within each bound). Returns
    (n, mean, M2, min, max) of each side's magnitudes, computed exactly as histogram._add_kernel would on that side alone (the same
    reference value, Kahan sum and order), so means agree to the bit with separate adds.

    Rejected: a sign mask, two gathers, a negation and one count per bound in NumPy, then two
    LatencyHistogram.add calls: 23 ms per million values; per-side state in small arrays
    indexed by sign: 13; scalars per side, as here: ~6.
    """
    nn = npos = 0
    nref = ns = nc = nsq = 0.0
    pref = ps = pc = psq = 0.0
    nlo = plo = np.iinfo(np.int64).max
    nhi = phi = np.int64(0)
    for i in range(values.shape[0]):
        v = values[i]
        if v < 0:
            v = -v
            neg_counts[bin_index(v)] += 1
            if nn == 0:
                nref = float(v)
            d = float(v) - nref
            y = d - nc
            t = ns + y
            nc = (t - ns) - y
            ns = t
            nsq += d * d
            nn += 1
            nlo = min(nlo, v)
            nhi = max(nhi, v)
        else:
            pos_counts[bin_index(v)] += 1
            if npos == 0:
                pref = float(v)
            d = float(v) - pref
            y = d - pc
            t = ps + y
            pc = (t - ps) - y
            ps = t
            psq += d * d
            npos += 1
            plo = min(plo, v)
            phi = max(phi, v)
        exceeded = 0  # how many (ascending) bounds |v| exceeds: branch-free, not a test per bound
        for j in range(bounds.shape[0]):
            exceeded += v > bounds[j]
        above[exceeded] += 1
    return _side(nn, nref, ns, nsq, nlo, nhi), _side(npos, pref, ps, psq, plo, phi)


@numba.njit((ro_c(I64), ro_c(I64), ro_c(I64), I64, rw(I64)), nogil=True, cache=True)
def inflight_at_starts(start, end, sorted_ends, carried, out):
    """For intervals [start[i], end[i]) with non-decreasing start and end >= start, out[i] = how
    many earlier intervals are still open at start[i] (end > start[i]). `sorted_ends` holds, in
    ascending order, the ends of these intervals plus those of `carried` earlier ones (all
    ending after start[0]). Returns k, how many of sorted_ends are <= start[-1]: the rest are
    the intervals still open, to carry into the next call.

    Earlier-and-open = (carried + i) - (ends <= start[i]) + (ends <= start[i] of i and later
    intervals); the last are empty intervals starting at start[i], counted by a backward pass.
    Rejected: a min-heap of open ends, pop and push per interval: 128 ns per interval with ~10
    open; a merge with a branch per step: 22; this branch-free merge after sorting the ends ~8.
    """
    n = start.shape[0]
    z = 0
    for i in range(n - 1, -1, -1):
        if i == n - 1 or start[i] != start[i + 1]:
            z = 0
        if end[i] == start[i]:
            z += 1
        out[i] = z
    m = sorted_ends.shape[0]
    if n == 0:
        return 0
    i = k = 0
    last = m - 1
    while i < n:
        # Either the next end is at or before start[i] (k advances) or start[i] is done.
        t = start[i]
        closed = (k < m) & (sorted_ends[min(k, last)] <= t)
        k += closed
        out[i] += (carried + i - k) * (1 - closed)
        i += 1 - closed
    return k


@numba.njit((ro_c(I64), I64), nogil=True, cache=True)
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


@numba.njit((rw(I64), rw(I64), rw(I64), rw(I64), I64), nogil=True, cache=True)
def sort_by_issue(issue, complete, seq, cap, budget):
    """Stable insertion sort of the four arrays, in place, by issue: linear on results, whose
    issue order departs from trace order only locally. Gives up (returns False, leaving a
    permutation whose equal keys are still in their first order) after `budget` moves, so a
    far-reordered input costs no more than the caller's fallback sort.

    Rejected: np.lexsort((seq, issue)) and four gathers per chunk, ~110 ms per million rows
    with the concatenations around it; this pass ~5.
    """
    moves = 0
    for i in range(1, issue.shape[0]):
        key = issue[i]
        if issue[i - 1] <= key:
            continue
        c, s, p = complete[i], seq[i], cap[i]
        j = i
        while j > 0 and issue[j - 1] > key:
            issue[j] = issue[j - 1]
            complete[j] = complete[j - 1]
            seq[j] = seq[j - 1]
            cap[j] = cap[j - 1]
            j -= 1
        issue[j], complete[j], seq[j], cap[j] = key, c, s, p
        moves += i - j
        if moves > budget:
            return False
    return True


@numba.njit((ro_c(U8), ro_c(I64), ro_c(I64), ro_c(I64), ro_c(I64), ro_c(I64)), nogil=True, cache=True)
def _scan(op, length, intended, issue, complete, result):
    """Run-level tallies of one chunk: (trace bytes of reads and writes, trace reads, issued
    rows, bytes transferred, issued reads, earliest intended-or-issue, last completion)."""
    trace_bytes = trace_reads = issued = nbytes = reads = 0
    first = np.iinfo(np.int64).max
    last = np.iinfo(np.int64).min
    for i in range(op.shape[0]):
        k = op[i]
        if k == _READ or k == _WRITE:
            trace_bytes += length[i]
        if k == _READ:
            trace_reads += 1
        if issue[i] < 0:
            continue
        issued += 1
        if result[i] > 0:
            nbytes += result[i]
        if k == _READ:
            reads += 1
        first = min(first, min(intended[i], issue[i]))
        last = max(last, complete[i])
    return trace_bytes, trace_reads, issued, nbytes, reads, first, last


@numba.njit((ro_c(I64), ro_c(I64), I64, I64, F64, rw(I64)), nogil=True, cache=True)
def _gaps(issue, ts, prev_issue, prev_ts, speed, out):
    """Inter-arrival errors: out[i] = (issue[i] - issue[i-1]) - rint((ts[i] - ts[i-1]) / speed),
    with (prev_issue, prev_ts) as row -1; the same float steps as NumPy's expression."""
    for i in range(issue.shape[0]):
        out[i] = (issue[i] - prev_issue) - np.int64(np.rint(np.float64(ts[i] - prev_ts) / speed))
        prev_issue = issue[i]
        prev_ts = ts[i]


class _OpenIntervals:
    """In-flight counting across chunks: the sorted ends of intervals still open at the last
    start seen."""

    def __init__(self):
        self.open = np.empty(0, np.int64)

    def counts(self, start, end):
        ends = np.concatenate([self.open, end])
        # Rejected: an insertion sort (the ends are nearly sorted): 24 ms per million ends with
        # lognormal latencies, ten in flight; NumPy's sort: 13.
        ends.sort()
        out = np.empty(len(start), np.int64)
        k = inflight_at_starts(start, end, ends, len(self.open), out)
        self.open = ends[k:].copy()
        return out


# ---- the measure ----------------------------------------------------------------------------


@dataclass
class Fidelity:
    """How closely a replay followed its trace (docs/results.md, Fidelity, with T(i), the intended
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
      order). Reordering is assumed not to span more than one chunk (2**19 rows as read here).
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
        op = np.ascontiguousarray(chunk["op"])
        n = len(ts)
        if not n:
            return
        seq = np.arange(self.rows, self.rows + n, dtype=np.int64)
        self.rows += n
        # The trace as captured.
        if self._first_ts is None:
            self._first_ts = int(ts[0])
        self._last_ts = int(ts[-1])
        trace_bytes, trace_reads, issued_n, nbytes, reads, first, last = _scan(
            op, length, intended, issue, complete, result)
        self._trace_bytes += int(trace_bytes)
        self._trace_reads += int(trace_reads)
        captured_inflight = None
        if self.with_latency:
            latency = np.ascontiguousarray(chunk[LATENCY], dtype=np.int64)
            ends = np.where(latency >= 0, ts + np.maximum(latency, 0), _NEVER)
            captured_inflight = self._captured.counts(ts, ends)
        # The replay.
        if issued_n < n:
            issued = issue >= 0
            ts, issue, intended, complete, seq = (a[issued] for a in (ts, issue, intended, complete, seq))
            if captured_inflight is not None:
                captured_inflight = captured_inflight[issued]
            if self.with_latency:
                latency = latency[issued]
        if not issued_n:
            return
        self.issued += int(issued_n)
        self._start = int(first) if self._start is None else min(self._start, int(first))
        self._end = int(last) if self._end is None else max(self._end, int(last))
        self._bytes += int(nbytes)
        self._reads += int(reads)
        self.issue_error.add(issue - intended)
        gaps = np.empty(len(issue), np.int64)
        if self._prev:
            _gaps(issue, ts, self._prev[0], self._prev[1], self.speed, gaps)
        else:
            _gaps(issue[1:], ts[1:], issue[0], ts[0], self.speed, gaps[1:])
            gaps = gaps[1:]
        self.inter_arrival.add(gaps)
        self._prev = (int(issue[-1]), int(ts[-1]))
        if self.with_latency:
            device = complete - issue
            known = latency >= 0
            if not known.all():
                device, latency = device[known], latency[known]
            self.replayed_latency.add(device)
            self.captured_latency.add(latency)
            self.latency_error.add(device - latency)
        cap = captured_inflight if captured_inflight is not None else np.zeros(len(issue), np.int64)
        self._take_in_issue_order(issue, complete, seq, cap, final=False)

    def _take_in_issue_order(self, issue, complete, seq, cap, final):
        """Rows reach here in trace order; in-flight at issue and ordering need issue order.

        Rows issued before this chunk's earliest issue are taken now, in issue order; the rest
        wait for the next chunk, on the assumption that no row later in the trace is issued
        before that earliest issue (reordering spans less than a chunk).
        """
        threshold = int(issue.min()) if len(issue) else None
        # Copies: the sort is in place, and the caller's arrays may be a chunk others read.
        if self._pending is not None:
            issue, complete, seq, cap = (np.concatenate([p, a]) for p, a in
                                         zip(self._pending, (issue, complete, seq, cap)))
        else:
            issue, complete, seq, cap = (a.copy() for a in (issue, complete, seq, cap))
        self._pending = None
        if not len(issue):
            return
        if not sort_by_issue(issue, complete, seq, cap, _SORT_BUDGET * len(issue)):
            # Stable, and equal issue times are still in trace order: the same as by (issue, seq).
            order = np.argsort(issue, kind="stable")
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
    for chunk in results.chunks(columns, rows=rows, ahead=1):
        builder.add(chunk)
    return builder.finish()
