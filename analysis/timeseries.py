"""Per-window time series of a replay (per second by default): IOPS and MB/s per op, device and
workload latency percentiles, mean in-flight count and schedule lateness, streamed from
results chunks with memory proportional to the number of windows, never to the rows.
"""
import math

import numba
import numpy as np

from analysis.histogram import log_linear_bins, log_linear_index, log_linear_mid
from traces.kernel_types import F64, I32, I64, U8, ro_c, rw
from traces.schema import RESULT_COLUMNS, TRACE_COLUMNS, Op

SECOND_NS = 1_000_000_000
_COLUMNS = ("op", "length", "intended_ns", "issue_ns", "complete_ns", "result")
assert all(name in TRACE_COLUMNS or name in RESULT_COLUMNS for name in _COLUMNS)
_N_OPS = len(Op)
OP_NAMES = tuple(op.name.lower() for op in Op)

# Per-window histograms bin as analysis.histogram does, but coarser than its LatencyHistogram
# (128 sub-buckets, 7,296 bins, 58 KB each): three of those per second would cost 630 MB for
# an hour-long run. With 32 linear sub-buckets per power of two a percentile (bin midpoint) is
# within 1/64 (1.6 %) of the true value, and values are counted up to 2**44 ns (4.9 h; larger
# ones land in the last bin, the exact max is kept aside): 1,280 int32 bins, 15 KB per window
# for all three.
SUB_BITS = 5
_TOP_BIT = 43
N_BINS = log_linear_bins(SUB_BITS, _TOP_BIT)
PERCENTILES = (50.0, 99.0, 99.9)
_KEYS = ("p50", "p99", "p99.9", "max")


@numba.njit((I64,), nogil=True, cache=True)
def bin_of(v):
    """Histogram bin of a non-negative value; values of 2**44 and above share the last bin."""
    return log_linear_index(v, SUB_BITS, _TOP_BIT)


@numba.njit((I64,), nogil=True, cache=True)
def bin_mid(i):
    """Midpoint of bin i (its lowest value plus half its width, rounded down)."""
    return log_linear_mid(i, SUB_BITS)


@numba.njit(
    (ro_c(U8), ro_c(I64), ro_c(I64), ro_c(I64), ro_c(I64), ro_c(I64), I64, rw(I64, 2), rw(I64, 2), rw(I64),
    rw(I32, 2), rw(I32, 2), rw(I32, 2), rw(I64), rw(I64), rw(I64), rw(I64), rw(I64)),
    nogil=True, cache=True,
)
def _accumulate(op, length, intended, issue, complete, result, bin_ns, counts, nbytes, errors,
                dev_h, work_h, late_h, dev_max, work_max, late_max, busy, full_diff):
    """One pass over a chunk; returns the number of rows never issued.

    By completion window: counts[op, w], nbytes[op, w] (positive results), errors[w], device
    and workload latency histograms. By issue window: lateness. In-flight: each I/O adds its
    time in flight [issue, complete) to the windows it overlaps, the partial ends to busy[w]
    and whole windows through the difference array full_diff (O(1) per I/O, however long).
    """
    not_issued = 0
    for i in range(op.shape[0]):
        s = issue[i]
        if s < 0:
            not_issued += 1
            continue
        c = complete[i]
        k = op[i]
        w = max(c, 0) // bin_ns
        counts[k, w] += 1
        if result[i] > 0:
            nbytes[k, w] += result[i]
        elif result[i] < 0:
            errors[w] += 1
        dev = c - s
        work = c - min(intended[i], s)
        dev_h[w, bin_of(dev)] += 1
        work_h[w, bin_of(work)] += 1
        dev_max[w] = max(dev_max[w], dev)
        work_max[w] = max(work_max[w], work)
        late = max(s - intended[i], 0)
        ws = max(s, 0) // bin_ns
        late_h[ws, bin_of(late)] += 1
        late_max[ws] = max(late_max[ws], late)
        a = max(s, 0)
        if c > a:
            wa = ws
            if wa == w:
                busy[wa] += c - a
            else:
                busy[wa] += (wa + 1) * bin_ns - a
                busy[w] += c - w * bin_ns
                full_diff[wa + 1] += 1
                full_diff[w] -= 1
    return not_issued


@numba.njit((ro_c(I32, 2), ro_c(I64), ro_c(F64), rw(F64, 2)), nogil=True, cache=True)
def _percentiles(hist, maxima, qs, out):
    """Nearest-rank percentiles (numpy's inverted_cdf) per window from its histogram row: the
    midpoint of the bin holding the ranked value, clamped to the window's max; NaN if empty."""
    for w in range(hist.shape[0]):
        n = 0
        for j in range(hist.shape[1]):
            n += hist[w, j]
        for qi in range(qs.shape[0]):
            if n == 0:
                out[qi, w] = np.nan
                continue
            rank = min(max(math.ceil(n * (qs[qi] / 100.0)), 1), n)
            if rank == n:
                out[qi, w] = maxima[w]
                continue
            seen = 0
            for j in range(hist.shape[1]):
                seen += hist[w, j]
                if seen >= rank:
                    out[qi, w] = min(bin_mid(j), maxima[w])
                    break


class TimeSeries:
    """Per-window figures; window w covers [w * bin_ns, (w + 1) * bin_ns) of the run's clock.

    IOPS, MB/s (10**6 bytes), errors and latency are counted in the window of each I/O's
    completion (as fio's logs and analysis.scoring do); lateness in the window of its issue.
    Latency and lateness are dicts of arrays "p50", "p99", "p99.9", "max" (ns; NaN for an
    empty window). `inflight` is the time-average count of I/Os between issue and completion.
    The last window is usually partial: it ends at `end_ns`, and its rates are still per
    whole window, as analysis.scoring.Bins reports them.
    """

    def __init__(self, bin_ns, counts, nbytes, errors, device, workload, lateness, inflight,
                 not_issued, end_ns):
        self.bin_ns = int(bin_ns)
        n = counts.shape[1]
        per_s = SECOND_NS / self.bin_ns
        self.t_s = np.arange(n, dtype=np.float64) * (self.bin_ns / SECOND_NS)
        self.counts = {name: counts[k].copy() for k, name in enumerate(OP_NAMES)}
        self.counts["all"] = counts.sum(axis=0)
        self.iops = {name: c * per_s for name, c in self.counts.items()}
        mb = {name: nbytes[k] * per_s / 1e6 for k, name in enumerate(OP_NAMES)}
        mb["all"] = nbytes.sum(axis=0) * per_s / 1e6
        self.mb_per_s = mb
        self.errors = errors
        self.device, self.workload, self.lateness = device, workload, lateness
        self.lateness_p99 = lateness["p99"]
        self.inflight = inflight
        self.not_issued = int(not_issued)
        self.end_ns = int(end_ns)

    def __len__(self):
        return len(self.t_s)

    def to_dict(self) -> dict:
        """JSON-able: lists per key, None for an empty window's latency."""

        def listed(a):
            return [None if isinstance(v, float) and math.isnan(v) else v for v in a.tolist()]

        return {
            "bin_ns": self.bin_ns,
            "end_ns": self.end_ns,
            "not_issued": self.not_issued,
            "t_s": self.t_s.tolist(),
            "iops": {k: v.tolist() for k, v in self.iops.items()},
            "mb_per_s": {k: v.tolist() for k, v in self.mb_per_s.items()},
            "errors": self.errors.tolist(),
            "device_latency_ns": {k: listed(v) for k, v in self.device.items()},
            "workload_latency_ns": {k: listed(v) for k, v in self.workload.items()},
            "lateness_ns": {k: listed(v) for k, v in self.lateness.items()},
            "inflight": self.inflight.tolist(),
        }


class SeriesBuilder:
    """Accumulates results chunks into a TimeSeries; `add` each chunk, then `finish`."""

    def __init__(self, bin_ns=SECOND_NS):
        self.bin_ns = int(bin_ns)
        if self.bin_ns < 1:
            raise ValueError(f"bin_ns must be at least 1, not {bin_ns}")
        self._n = 0
        self.counts = np.zeros((_N_OPS, 0), np.int64)
        self.nbytes = np.zeros((_N_OPS, 0), np.int64)
        self.errors = np.zeros(0, np.int64)
        self.hists = [np.zeros((0, N_BINS), np.int32) for _ in range(3)]  # device, workload, late
        self.maxima = [np.zeros(0, np.int64) for _ in range(3)]
        self.busy = np.zeros(0, np.int64)
        self.full_diff = np.zeros(1, np.int64)
        self.not_issued = 0
        self.end_ns = 0

    def _grow(self, size):
        pad = size - self._n

        def more(a, axis):
            shape = list(a.shape)
            shape[axis] = pad
            return np.concatenate([a, np.zeros(shape, a.dtype)], axis=axis)

        self.counts, self.nbytes = more(self.counts, 1), more(self.nbytes, 1)
        self.errors, self.busy, self.full_diff = more(self.errors, 0), more(self.busy, 0), more(self.full_diff, 0)
        self.hists = [more(h, 0) for h in self.hists]
        self.maxima = [more(m, 0) for m in self.maxima]
        self._n = size

    def add(self, chunk) -> None:
        missing = [name for name in _COLUMNS if name not in chunk]
        if missing:
            raise ValueError(f"result chunk lacks column(s) {missing}; it needs {list(_COLUMNS)}")
        op = np.ascontiguousarray(chunk["op"])
        if not len(op):
            return
        if op.dtype.kind not in "iu" or int(op.max()) >= _N_OPS or int(op.min()) < 0:
            raise ValueError(f"op codes must be 0..{_N_OPS - 1} (an Op)")
        op = op.astype(np.uint8, copy=False)
        length, intended, issue, complete, result = (
            np.ascontiguousarray(chunk[name], dtype=np.int64) for name in _COLUMNS[1:]
        )
        issued = issue >= 0
        if not issued.any():
            self.not_issued += len(op)
            return
        if (complete[issued] < issue[issued]).any():
            row = int(np.flatnonzero(issued & (complete < issue))[0])
            raise ValueError(f"row {row} completed before it was issued; the result columns must "
                             "share one monotonic clock")
        last = int(complete[issued].max())
        self.end_ns = max(self.end_ns, last)
        needed = max(last, int(issue.max())) // self.bin_ns + 1
        if needed > self._n:
            self._grow(max(needed, 2 * self._n))
        self.not_issued += _accumulate(
            op, length, intended, issue, complete, result, self.bin_ns, self.counts, self.nbytes,
            self.errors, *self.hists, *self.maxima, self.busy, self.full_diff,
        )

    def finish(self) -> TimeSeries:
        busy_bins = self.busy > 0
        used = np.flatnonzero(self.counts.sum(axis=0) + busy_bins)
        n = int(used[-1]) + 1 if used.size else 0
        qs = np.array(PERCENTILES)
        figures = []
        for hist, maxima in zip(self.hists, self.maxima):
            out = np.empty((len(qs), n))
            _percentiles(hist[:n], maxima[:n], qs, out)
            d = {key: out[i] for i, key in enumerate(_KEYS[:-1])}
            d["max"] = np.where(hist[:n].sum(axis=1) > 0, maxima[:n].astype(np.float64), np.nan)
            figures.append(d)
        full = np.cumsum(self.full_diff[:n])
        inflight = (self.busy[:n] + full * self.bin_ns) / self.bin_ns
        return TimeSeries(self.bin_ns, self.counts[:, :n], self.nbytes[:, :n], self.errors[:n],
                          *figures, inflight, self.not_issued, self.end_ns)


def time_series(chunks, bin_ns=SECOND_NS) -> TimeSeries:
    """The time series of results `chunks` (an iterable of dicts of arrays with op, length,
    intended_ns, issue_ns, complete_ns and result), in windows of `bin_ns` nanoseconds."""
    builder = SeriesBuilder(bin_ns)
    for chunk in chunks:
        builder.add(chunk)
    return builder.finish()
