"""Streaming log-linear latency histograms (HdrHistogram/fio style) over int64 nanoseconds.

Fixed memory whatever the run length: exact below 2**SUB_BITS, then each power of two is
split into 2**SUB_BITS linear sub-buckets, so any reported percentile is within 1/256.
"""
import math

import numba
import numpy as np

# leading_zeros is Numba's wrapper of LLVM's ctlz, public in numba.cpython.unsafe since 0.47.
# Rejected alternatives, 10M lognormal values into one histogram on the dev box:
# ctlz 2.5 ns/value, math.frexp of float(v) 9.4, branch-free binary search 9.5, shift loop 24.
from numba.cpython.unsafe.numbers import leading_zeros

from traces.kernel_types import I64, ro_c, rw

SUB_BITS = 7
SUB_BUCKETS = 1 << SUB_BITS  # 128
# The largest int64 has its highest set bit at 62, so no value here shares the last bin.
TOP_BIT = 62

# The percentiles fio reports by default, and the keys it uses for them.
FIO_PERCENTILES = (1.0, 5.0, 10.0, 50.0, 90.0, 99.0, 99.9, 99.99)


# The log-linear binning, for any resolution: with s = sub_bits, bin i < 2 * 2**s holds
# exactly the value i. Above that, a value v with highest set bit b (s < b <= top_bit) has
# shift t = b - s and lands in bin t * 2**s + (v >> t), where v >> t is in [2**s, 2 * 2**s);
# values with b > top_bit share the last bin. LatencyHistogram uses s = 7 over all of int64;
# analysis.timeseries's per-window histograms a coarser s = 5 up to 2**44 ns.


def log_linear_bins(sub_bits: int, top_bit: int) -> int:
    """How many bins the binning of `sub_bits` up to highest bit `top_bit` has."""
    return (top_bit - sub_bits) * (1 << sub_bits) + 2 * (1 << sub_bits)


@numba.njit((I64, I64, I64), nogil=True, cache=True, inline="always")
def log_linear_index(v, sub_bits, top_bit):
    """The bin of a non-negative int64 value (the caller guarantees v >= 0)."""
    sub = 1 << sub_bits
    if v < 2 * sub:
        return v
    b = 63 - leading_zeros(v)
    if b > top_bit:
        return (top_bit - sub_bits) * sub + 2 * sub - 1
    shift = b - sub_bits
    return shift * sub + (v >> shift)


@numba.njit((I64, I64), nogil=True, cache=True, inline="always")
def log_linear_lower(i, sub_bits):
    """Smallest value that falls in bin i."""
    sub = 1 << sub_bits
    if i < 2 * sub:
        return np.int64(i)
    shift = i // sub - 1
    return np.int64(i - shift * sub) << shift


@numba.njit((I64, I64), nogil=True, cache=True, inline="always")
def log_linear_width(i, sub_bits):
    """How many consecutive values bin i holds (a power of two)."""
    sub = 1 << sub_bits
    if i < 2 * sub:
        return np.int64(1)
    return np.int64(1) << (i // sub - 1)


@numba.njit((I64, I64), nogil=True, cache=True, inline="always")
def log_linear_mid(i, sub_bits):
    """Midpoint of bin i (its lowest value plus half its width, rounded down): what a
    percentile reports, within half a bin of the true value."""
    return log_linear_lower(i, sub_bits) + (log_linear_width(i, sub_bits) - 1) // 2


N_BINS = log_linear_bins(SUB_BITS, TOP_BIT)  # 7296


@numba.njit((I64,), nogil=True, cache=True, inline="always")
def bin_index(v):
    """The bin of a non-negative int64 value (the caller guarantees v >= 0)."""
    return log_linear_index(v, SUB_BITS, TOP_BIT)


@numba.njit((I64,), nogil=True, cache=True)
def bin_lower(i):
    """Smallest value that falls in bin i."""
    return log_linear_lower(i, SUB_BITS)


@numba.njit((I64,), nogil=True, cache=True)
def bin_width(i):
    """How many consecutive values bin i holds (a power of two)."""
    return log_linear_width(i, SUB_BITS)


@numba.njit((I64,), nogil=True, cache=True)
def bin_mid(i):
    """Midpoint of bin i (its lowest value plus half its width, rounded down)."""
    return log_linear_mid(i, SUB_BITS)


@numba.njit((ro_c(I64), rw(I64)), nogil=True, cache=True)
def _add_kernel(values, counts):
    """Count `values` into `counts`; return (first negative index or -1, mean, M2, min, max).

    Mean and M2 (sum of squared deviations from the mean) are computed around the chunk's
    first value so that constant or narrow data far from zero keeps its precision.
    On a negative value the counts already added are taken back, so the histogram is
    unchanged when the caller raises.
    """
    n = values.shape[0]
    lo = np.iinfo(np.int64).max
    hi = np.int64(0)
    if n == 0:
        return -1, 0.0, 0.0, lo, hi
    ref = float(values[0])
    s = 0.0
    c = 0.0  # Kahan compensation of s: plain summation lost ~1e-12 of the mean over a few
    sq = 0.0  # hundred values when the first was far from the rest (4e13 ns among zeros)
    for i in range(n):
        v = values[i]
        if v < 0:
            for j in range(i):
                counts[bin_index(values[j])] -= 1
            return i, 0.0, 0.0, lo, hi
        counts[bin_index(v)] += 1
        d = float(v) - ref
        y = d - c
        t = s + y
        c = (t - s) - y
        s = t
        sq += d * d
        lo = min(lo, v)
        hi = max(hi, v)
    m2 = max(sq - s * s / n, 0.0)
    return -1, ref + s / n, m2, lo, hi


class LatencyHistogram:
    """Counts of non-negative int64 values (nanoseconds) in N_BINS log-linear bins.

    Count, min and max are exact; mean and stddev are exact up to float rounding (they are
    accumulated from the values, not the bins). Percentiles are nearest-rank (numpy's
    method="inverted_cdf"): the midpoint of the bin holding the ranked value, clamped to
    [min, max]. A bin of width w starts at >= 128*w, so the midpoint is within w/2, i.e.
    1/256 relative, of the true value; the midpoint halves the error of fio's upper bound.
    Empty histograms report None for min, max, mean, stddev and percentiles.
    """

    __slots__ = ("counts", "_count", "_mean", "_m2", "_min", "_max")

    def __init__(self, counts=None):
        """`counts`: an int64 array of N_BINS zeros to count in (a caller that bins values
        itself, then calls `combine`); a new one when None."""
        self.counts = np.zeros(N_BINS, dtype=np.int64) if counts is None else counts
        self._count = 0
        # The mean and M2 = sum of squared deviations from it, merged with Chan et al.'s
        # formula. Rejected: running float sums of values and squares; with values ~1e15 ns
        # (days) and a spread of 1 ns the sum of squares cancels to a stddev off by ~1e7, and
        # even a plain sum (1e17, ulp 16) skewed the stddev by 2 %.
        self._mean = 0.0
        self._m2 = 0.0
        self._min = None
        self._max = None

    def add(self, values):
        """Count a 1-D array of non-negative integer values (ns); negative values raise ValueError."""
        values = np.asarray(values)
        if values.ndim != 1:
            raise ValueError(f"expected a 1-D array of nanoseconds, got shape {values.shape}")
        if values.dtype.kind not in "iu":
            raise TypeError(f"expected integer nanoseconds, got dtype {values.dtype}")
        if values.dtype.kind == "u" and values.size and values.max() > np.iinfo(np.int64).max:
            raise ValueError("value above the int64 range; histograms hold int64 nanoseconds")
        values = np.ascontiguousarray(values, dtype=np.int64)
        if values.size == 0:
            return
        bad, mean, m2, lo, hi = _add_kernel(values, self.counts)
        if bad >= 0:
            raise ValueError(
                f"negative latency {int(values[bad])} ns at index {bad}: a latency is an end"
                " time minus an earlier start time; check how the caller computed it"
            )
        self.combine(len(values), float(mean), float(m2), int(lo), int(hi))

    def merge(self, other):
        """Add every value counted by `other` into this histogram."""
        self.counts += other.counts
        if other._count:
            self.combine(other._count, other._mean, other._m2, other._min, other._max)

    def combine(self, n, mean, m2, lo, hi):
        """Account for `n` values with that mean, M2 (sum of squared deviations from the
        mean), min and max, whose bins the caller has counted into `counts` already."""
        if self._count == 0:
            self._count, self._mean, self._m2, self._min, self._max = n, mean, m2, lo, hi
            return
        na = self._count
        total = na + n
        delta = mean - self._mean
        self._m2 += m2 + delta * delta * (na * n / total)
        self._mean += delta * (n / total)
        self._count = total
        self._min = min(self._min, lo)
        self._max = max(self._max, hi)

    @property
    def count(self):
        return self._count

    @property
    def sum(self):
        """Sum of the values as a float."""
        return self._mean * self._count

    @property
    def min(self):
        return self._min

    @property
    def max(self):
        return self._max

    @property
    def mean(self):
        return self._mean if self._count else None

    @property
    def stddev(self):
        """Sample standard deviation (n - 1 denominator, as fio reports); 0.0 for one value."""
        if not self._count:
            return None
        if self._count == 1:
            return 0.0
        return math.sqrt(self._m2 / (self._count - 1))

    def percentile(self, q):
        """Nearest-rank q-th percentile (0 <= q <= 100) in ns, or None if empty."""
        return self.percentiles([q])[0]

    def percentiles(self, qs):
        """Nearest-rank percentiles for each q in `qs`, as a list of ints (None if empty)."""
        qs = [float(q) for q in qs]
        for q in qs:
            if not 0.0 <= q <= 100.0:
                raise ValueError(f"percentile {q} is outside [0, 100]")
        n = self._count
        if n == 0:
            return [None] * len(qs)
        cumulative = np.cumsum(self.counts)
        out = []
        for q in qs:
            # Same float arithmetic as numpy's inverted_cdf, so ranks agree exactly.
            rank = min(max(math.ceil(n * (q / 100.0)), 1), n)
            if rank == 1:
                out.append(self._min)
                continue
            if rank == n:
                out.append(self._max)
                continue
            i = int(np.searchsorted(cumulative, rank, side="left"))
            mid = int(bin_mid(i))
            out.append(min(max(mid, self._min), self._max))
        return out

    def __repr__(self):
        return (
            f"LatencyHistogram(count={self._count}, min={self._min}, max={self._max},"
            f" mean={self.mean})"
        )
