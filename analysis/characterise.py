"""Characterise a trace in one streaming pass: mix, sizes, sequentiality, timing, burstiness,
queue depth, span, footprint and working set over time, and reuse distance. Memory is bounded
whatever the trace's length (bitmaps over the span or HyperLogLog sketches, SHARDS sampling).
"""
import math
from dataclasses import asdict, dataclass, field

import numba
import numpy as np

from numba import types
from numba.typed import Dict

from analysis.histogram import N_BINS, LatencyHistogram, bin_index, bin_mid
from traces.kernel_types import I32, I64, U8, ro_c, rw
from traces.schema import Op
from traces.units import human_bytes

BLOCK_SHIFT = 12  # working set in 4 KiB blocks
# Largest bitmap kept: 2**29 bits = 64 MiB covers a 2 TiB span; beyond it HyperLogLog.
MAX_BITMAP_BLOCKS = 1 << 29
HLL_P = 14  # 16384 registers: 1.04 / sqrt(16384) = 0.8 % standard error
QD_WINDOWS = 100
# Exact per-window working sets from an int32 stamp per block up to 2**24 blocks (64 MiB,
# a 64 GiB span); beyond it one HyperLogLog sketch per window.
MAX_STAMP_BLOCKS = 1 << 24
# SHARDS reuse distances: a block is sampled when the top SHARDS_BITS bits of its hash are
# below a threshold T, halved whenever more than REUSE_MAX_BLOCKS blocks are being tracked.
SHARDS_BITS = 24
REUSE_MAX_BLOCKS = 1 << 20
REUSE_PERCENTILES = (50.0, 90.0, 99.0)
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


# ---------------------------------------------------------------------------------------
# Kernels (each tested against a NumPy reference in tests/analysis/test_characterise.py)
# ---------------------------------------------------------------------------------------

@numba.njit((ro_c(U8), ro_c(I64), ro_c(I64), rw(I64), rw(I64)), nogil=True, cache=True)
def sequential_kernel(op, offset, length, last_end, counts):
    """Count reads/writes starting where the previous I/O of the same direction ended.

    last_end[d] carries the previous end across chunks (-1: none yet); counts[d] += hits.
    """
    for i in range(op.size):
        d = op[i]
        if d > 1:  # only reads (0) and writes (1) have a direction
            continue
        if offset[i] == last_end[d]:
            counts[d] += 1
        last_end[d] = offset[i] + length[i]


@numba.njit((ro_c(I64), ro_c(I64), I64, rw(I64)), nogil=True, cache=True)
def qd_kernel(ts, latency, window_ns, busy):
    """Add each I/O's in-flight interval [ts, ts + latency) to the windows it overlaps.

    busy[w] collects in-flight nanoseconds in window w (w * window_ns onwards); divided by
    window_ns it is the window's mean queue depth. Intervals past the last window are cut.
    """
    n_windows = busy.size
    for i in range(ts.size):
        lat = latency[i]
        if lat <= 0:
            continue
        start = ts[i]
        end = start + lat
        w = start // window_ns
        while w < n_windows:
            w_start = w * window_ns
            w_end = w_start + window_ns
            lo = start if start > w_start else w_start
            hi = end if end < w_end else w_end
            if hi <= lo:
                break
            busy[w] += hi - lo
            w += 1


@numba.njit((ro_c(I64), ro_c(I64), I64, rw(U8)), nogil=True, cache=True)
def mark_blocks(offset, length, block_shift, bitmap):
    """Set the bit of every block touched (offsets relative to the bitmap's base); count new ones."""
    new = 0
    for i in range(offset.size):
        if length[i] <= 0:
            continue
        first = offset[i] >> block_shift
        last = (offset[i] + length[i] - 1) >> block_shift
        for b in range(first, last + 1):
            byte = b >> 3
            bit = np.uint8(1 << (b & 7))
            if not bitmap[byte] & bit:
                bitmap[byte] |= bit
                new += 1
    return new


@numba.njit(inline="always")
def _splitmix64(x):
    x = (x + np.uint64(0x9E3779B97F4A7C15))
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@numba.njit((ro_c(I64), ro_c(I64), I64, I64, rw(U8)), nogil=True, cache=True)
def hll_kernel(offset, length, block_shift, p, registers):
    """HyperLogLog update with the blocks each I/O touches (hash: splitmix64 of the block)."""
    shift = np.uint64(64 - p)
    for i in range(offset.size):
        if length[i] <= 0:
            continue
        first = offset[i] >> block_shift
        last = (offset[i] + length[i] - 1) >> block_shift
        for b in range(first, last + 1):
            h = _splitmix64(np.uint64(b))
            idx = h >> shift
            rest = h << np.uint64(p)
            rank = 1
            while rank <= 64 - p and not (rest & np.uint64(1 << 63)):
                rest = rest << np.uint64(1)
                rank += 1
            if rank > registers[idx]:
                registers[idx] = rank


def hll_estimate(registers: np.ndarray) -> float:
    """Distinct count from HyperLogLog registers, with the small-range (linear counting) fix."""
    m = registers.size
    alpha = 0.7213 / (1 + 1.079 / m)
    estimate = alpha * m * m / np.sum(np.ldexp(1.0, -registers.astype(np.int64)))
    zeros = int(np.count_nonzero(registers == 0))
    if estimate <= 2.5 * m and zeros:
        return m * np.log(m / zeros)
    return float(estimate)


@numba.njit((ro_c(I64), ro_c(I64), I64, rw(I32), I64), nogil=True, cache=True)
def stamp_blocks(offset, length, block_shift, stamps, stamp):
    """Count the blocks touched whose stamp is not yet `stamp`, and stamp them.

    With stamp = window + 1 this counts each window's distinct blocks without clearing
    anything between windows.
    """
    new = 0
    for i in range(offset.size):
        if length[i] <= 0:
            continue
        first = offset[i] >> block_shift
        last = (offset[i] + length[i] - 1) >> block_shift
        for b in range(first, last + 1):
            if stamps[b] != stamp:
                stamps[b] = stamp
                new += 1
    return new


@numba.njit(inline="always")
def _fenwick_add(tree, i, v):
    i += 1
    while i <= tree.size:
        tree[i - 1] += v
        i += i & -i


@numba.njit(inline="always")
def _fenwick_prefix(tree, i):
    """Sum of positions [0, i)."""
    s = 0
    while i > 0:
        s += tree[i - 1]
        i -= i & -i
    return s


@numba.njit((types.DictType(I64, I64), rw(I64)), nogil=True, cache=True)
def _reuse_compact(last, tree):
    """Renumber the live last-access times 0..n-1 in order and rebuild the tree; return n."""
    n = len(last)
    keys = np.empty(n, np.int64)
    times = np.empty(n, np.int64)
    i = 0
    for k, t in last.items():
        keys[i] = k
        times[i] = t
        i += 1
    order = np.argsort(times)
    tree[:] = 0
    for r in range(n):
        last[keys[order[r]]] = r
        _fenwick_add(tree, r, 1)
    return n


@numba.njit((types.DictType(I64, I64), rw(I64), I64), nogil=True, cache=True)
def _reuse_evict(last, tree, threshold):
    """Stop tracking the blocks whose hash is no longer below `threshold`."""
    gone = []
    for k in last.keys():
        if (_splitmix64(np.uint64(k)) >> np.uint64(64 - SHARDS_BITS)) >= threshold:
            gone.append(k)
    for k in gone:
        _fenwick_add(tree, last.pop(k), -1)


@numba.njit(
    types.void(ro_c(I64), ro_c(I64), I64, types.DictType(I64, I64), rw(I64), rw(I64), rw(I64)),
    nogil=True,
    cache=True,
)
def reuse_kernel(offset, length, block_shift, last, tree, state, hist):
    """SHARDS-sampled LRU stack distances of block accesses, in access order.

    Each I/O with length > 0 accesses its blocks in order. A block is sampled when the top
    SHARDS_BITS bits of its hash are below state[1] (T; the rate is T / 2**SHARDS_BITS).
    `last` maps a sampled block to the time (sampled-access count) of its latest access, and
    the Fenwick tree `tree` holds a 1 at each such time, so the distinct blocks accessed since
    time t are the ones marked in (t, now). Each distance counts 1 / rate blocks (SHARDS'
    scaling), with weight 1 / rate into `hist` (analysis.histogram bins of blocks).
    state: [now, T, max tracked blocks, cold (weighted), min distance, max distance].
    When `now` reaches the tree's size the times are renumbered (there are at most
    max-tracked of them), so memory stays bounded whatever the trace's length.
    """
    full = np.int64(1) << SHARDS_BITS
    for i in range(offset.size):
        if length[i] <= 0:
            continue
        first = offset[i] >> block_shift
        end = (offset[i] + length[i] - 1) >> block_shift
        for b in range(first, end + 1):
            h = np.int64(_splitmix64(np.uint64(b)) >> np.uint64(64 - SHARDS_BITS))
            if h >= state[1]:
                continue
            if state[0] == tree.size:
                state[0] = _reuse_compact(last, tree)
            now = state[0]
            weight = full // state[1]
            t = last.get(b, -1)
            if t >= 0:
                d = (_fenwick_prefix(tree, now) - _fenwick_prefix(tree, t + 1)) * weight
                _fenwick_add(tree, t, -1)
                hist[bin_index(d)] += weight
                if state[4] < 0 or d < state[4]:
                    state[4] = d
                if d > state[5]:
                    state[5] = d
            else:
                state[3] += weight
            last[b] = now
            _fenwick_add(tree, now, 1)
            state[0] = now + 1
            if len(last) > state[2]:
                while len(last) > state[2] and state[1] > 1:
                    state[1] //= 2
                    _reuse_evict(last, tree, state[1])


def weighted_percentiles(hist: np.ndarray, lo: int, hi: int, qs) -> list:
    """Nearest-rank percentiles of a weighted analysis.histogram bin array, as
    LatencyHistogram.percentiles computes them (bin midpoints, clamped to [lo, hi])."""
    n = int(hist.sum())
    if not n:
        return [None] * len(qs)
    cumulative = np.cumsum(hist)
    out = []
    for q in qs:
        rank = min(max(math.ceil(n * (q / 100.0)), 1), n)
        i = int(np.searchsorted(cumulative, rank, side="left"))
        mid = int(bin_mid(i))
        out.append(min(max(mid, lo), hi))
    return out


# ---------------------------------------------------------------------------------------
# The characterisation
# ---------------------------------------------------------------------------------------

@dataclass
class Characterisation:
    ios: int = 0
    reads: int = 0
    writes: int = 0
    discards: int = 0
    flushes: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    duration_ns: int = 0
    read_share_count: float | None = None  # reads / (reads + writes)
    read_share_bytes: float | None = None
    size_histogram: dict = field(default_factory=dict)  # "<=4 KiB" -> {"read": n, "write": n}
    dominant_sizes: list = field(default_factory=list)  # [[bytes, count, share of reads+writes]]
    sequential_share: float | None = None  # of reads and writes
    sequential_read_share: float | None = None
    sequential_write_share: float | None = None
    interarrival_ns: dict = field(default_factory=dict)  # "mean", "p50", ...
    latency_ns: dict = field(default_factory=dict)  # when the trace has latency_ns
    mean_queue_depth: float | None = None
    queue_depth_window_ns: int = 0
    queue_depth: list = field(default_factory=list)  # mean QD per window
    min_offset: int | None = None
    span_bytes: int = 0  # max(offset + length)
    working_set_bytes: int = 0  # distinct 4 KiB blocks touched, times 4 KiB
    working_set_exact: bool = True
    # Burstiness: std / mean of the inter-arrival gaps (1 for Poisson arrivals, > 1 bursty),
    # and the busiest window's I/Os over the mean per window (windows as for queue depth).
    interarrival_cv: float | None = None
    ios_per_window: list = field(default_factory=list)
    peak_to_mean_ios: float | None = None
    # Cumulative distinct bytes touched (4 KiB blocks) at the end of each window, exact or
    # estimated as working_set_bytes is; and the distinct bytes touched within each window.
    footprint_bytes: list = field(default_factory=list)
    window_working_set_bytes: list = field(default_factory=list)
    window_working_set_exact: bool = True
    # LRU stack distance of each 4 KiB block access that is not the block's first (cold):
    # distinct other blocks accessed since, in bytes; SHARDS-sampled at reuse_sample_rate.
    reuse_distance_bytes: dict = field(default_factory=dict)  # "p50", "p90", "p99"
    reuse_cold_share: float | None = None  # of block accesses
    reuse_sample_rate: float = 1.0
    # Inferred dependencies and think time (analysis.causal) when the trace has pid and
    # latency_ns: what `--timing causal` replays. None otherwise.
    causal: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _bucket_label(bits: int) -> str:
    size = 1 << bits
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= unit:
            return f"<={size // unit} {name}"
    return f"<={size} B"


def _share(part, whole):
    return part / whole if whole else None


def characterise(trace, windows: int = QD_WINDOWS, rows: int | None = None,
                 max_bitmap_blocks: int = MAX_BITMAP_BLOCKS,
                 max_stamp_blocks: int = MAX_STAMP_BLOCKS,
                 reuse_max_blocks: int = REUSE_MAX_BLOCKS) -> Characterisation:
    """Characterise an opened trace (traces.trace.TraceFile) in one pass over chunks of `rows`.

    The working set and footprint are exact from a bitmap while the span holds at most
    `max_bitmap_blocks` 4 KiB blocks, and a HyperLogLog estimate (0.8 % standard error)
    beyond; the per-window working sets likewise up to `max_stamp_blocks`. Reuse distances
    are exact while at most `reuse_max_blocks` distinct blocks are touched, and SHARDS
    estimates beyond (the sampling rate halves each time the tracked blocks exceed it).
    """
    c = Characterisation()
    has_latency = trace.has("latency_ns")
    columns = ["ts_ns", "op", "offset", "length"] + (["latency_ns"] if has_latency else [])
    span = trace.span()
    duration = trace.duration_ns()
    c.duration_ns = duration
    window_ns = max(1, -(-max(duration, 1) // windows))
    busy = np.zeros(windows, np.int64)
    c.queue_depth_window_ns = int(window_ns)

    use_bitmap = (span >> BLOCK_SHIFT) + 1 <= max_bitmap_blocks
    bitmap = np.zeros(((span >> BLOCK_SHIFT) >> 3) + 1, np.uint8) if use_bitmap else None
    registers = None if use_bitmap else np.zeros(1 << HLL_P, np.uint8)
    blocks = 0
    ios_window = np.zeros(windows, np.int64)
    footprint = np.full(windows, -1, np.int64)  # -1: no I/O in the window yet
    window_ws = np.zeros(windows, np.int64)
    use_stamps = (span >> BLOCK_SHIFT) + 1 <= max_stamp_blocks
    stamps = np.zeros((span >> BLOCK_SHIFT) + 1, np.int32) if use_stamps else None
    window_regs = None if use_stamps else np.zeros(1 << HLL_P, np.uint8)
    open_window = -1  # the window window_regs is collecting
    reuse_last = Dict.empty(types.int64, types.int64)
    reuse_tree = np.zeros(max(4 * reuse_max_blocks, 64), np.int64)
    reuse_state = np.array([0, 1 << SHARDS_BITS, reuse_max_blocks, 0, -1, 0], np.int64)
    reuse_hist = np.zeros(N_BINS, np.int64)

    last_end = np.full(2, -1, np.int64)
    seq = np.zeros(2, np.int64)
    bucket_counts = np.zeros((2, 64), np.int64)
    sizes: dict[int, int] = {}
    gaps = LatencyHistogram()
    latencies = LatencyHistogram()
    prev_ts = None
    min_offset = None
    for chunk in trace.chunks(columns, rows=rows):
        ts, op, offset, length = chunk["ts_ns"], chunk["op"], chunk["offset"], chunk["length"]
        if not len(ts):
            continue
        c.ios += len(ts)
        counts = np.bincount(op, minlength=4)
        c.reads += int(counts[Op.READ])
        c.writes += int(counts[Op.WRITE])
        c.discards += int(counts[Op.DISCARD])
        c.flushes += int(counts[Op.FLUSH])
        data = (op == Op.READ) | (op == Op.WRITE)
        c.read_bytes += int(length[op == Op.READ].sum())
        c.write_bytes += int(length[op == Op.WRITE].sum())
        # Bucket b holds lengths in (2**(b-1), 2**b].
        bits = np.zeros(len(length), np.int64)
        pos = length > 1
        bits[pos] = np.floor(np.log2(length[pos] - 1)).astype(np.int64) + 1
        for d in (Op.READ, Op.WRITE):
            bucket_counts[int(d)] += np.bincount(bits[op == d], minlength=64)[:64]
        uniq, n = np.unique(length[data], return_counts=True)
        for size, k in zip(uniq.tolist(), n.tolist()):
            sizes[size] = sizes.get(size, 0) + k
        sequential_kernel(op, offset, length, last_end, seq)
        diffs = np.diff(ts) if prev_ts is None else np.diff(ts, prepend=prev_ts)
        gaps.add(diffs)
        prev_ts = int(ts[-1])
        if has_latency:
            lat = chunk["latency_ns"]
            latencies.add(lat[lat >= 0])
            qd_kernel(ts, lat, window_ns, busy)
        touched = length > 0
        if touched.any():
            lo = int(offset[touched].min())
            min_offset = lo if min_offset is None else min(min_offset, lo)
        reuse_kernel(offset, length, BLOCK_SHIFT, reuse_last, reuse_tree, reuse_state, reuse_hist)
        # The chunk in runs of one window each (ts_ns never decreases).
        win = np.minimum(ts // window_ns, windows - 1)
        ios_window += np.bincount(win, minlength=windows)
        cuts = np.concatenate(([0], np.flatnonzero(np.diff(win)) + 1, [len(win)]))
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            w = int(win[a])
            off, ln = offset[a:b], length[a:b]
            if use_bitmap:
                blocks += mark_blocks(off, ln, BLOCK_SHIFT, bitmap)
                footprint[w] = blocks
            else:
                hll_kernel(off, ln, BLOCK_SHIFT, HLL_P, registers)
                footprint[w] = int(round(hll_estimate(registers)))
            if use_stamps:
                window_ws[w] += stamp_blocks(off, ln, BLOCK_SHIFT, stamps, w + 1)
            else:
                if w != open_window:
                    if open_window >= 0:
                        window_ws[open_window] = int(round(hll_estimate(window_regs)))
                    window_regs[:] = 0
                    open_window = w
                hll_kernel(off, ln, BLOCK_SHIFT, HLL_P, window_regs)

    rw = c.reads + c.writes
    c.read_share_count = _share(c.reads, rw)
    c.read_share_bytes = _share(c.read_bytes, c.read_bytes + c.write_bytes)
    c.size_histogram = {
        _bucket_label(b): {"read": int(bucket_counts[0, b]), "write": int(bucket_counts[1, b])}
        for b in range(64) if bucket_counts[:, b].any()
    }
    top = sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    c.dominant_sizes = [[int(s), int(k), k / rw] for s, k in top]
    c.sequential_share = _share(int(seq.sum()), rw)
    c.sequential_read_share = _share(int(seq[0]), c.reads)
    c.sequential_write_share = _share(int(seq[1]), c.writes)
    if gaps.count:
        c.interarrival_ns = {"mean": gaps.mean, **{f"p{q:g}": gaps.percentile(q) for q in PERCENTILES}}
    if has_latency and latencies.count:
        c.latency_ns = {"mean": latencies.mean, **{f"p{q:g}": latencies.percentile(q) for q in PERCENTILES}}
        c.queue_depth = (busy / window_ns).round(3).tolist()
        c.mean_queue_depth = float(busy.sum() / (window_ns * windows))
    if not use_stamps and open_window >= 0:
        window_ws[open_window] = int(round(hll_estimate(window_regs)))
    if gaps.count and gaps.mean:
        c.interarrival_cv = gaps.stddev / gaps.mean
    if c.ios:
        c.ios_per_window = ios_window.tolist()
        c.peak_to_mean_ios = float(ios_window.max() * windows / c.ios)
        filled = np.maximum.accumulate(footprint)  # windows without I/O keep the last value
        c.footprint_bytes = (np.maximum(filled, 0) << BLOCK_SHIFT).tolist()
        c.window_working_set_bytes = (window_ws << BLOCK_SHIFT).tolist()
        c.window_working_set_exact = use_stamps
    now, threshold, _, cold, lo, hi = (int(x) for x in reuse_state)
    accesses = cold + int(reuse_hist.sum())
    c.reuse_sample_rate = threshold / (1 << SHARDS_BITS)
    c.reuse_cold_share = _share(cold, accesses)
    if accesses > cold:
        values = weighted_percentiles(reuse_hist, lo, hi, REUSE_PERCENTILES)
        c.reuse_distance_bytes = {f"p{q:g}": v << BLOCK_SHIFT for q, v in zip(REUSE_PERCENTILES, values)}
    c.min_offset = min_offset
    c.span_bytes = span
    if use_bitmap:
        c.working_set_bytes = blocks << BLOCK_SHIFT
    else:
        c.working_set_bytes = int(round(hll_estimate(registers))) << BLOCK_SHIFT
        c.working_set_exact = False
    from analysis import causal

    summary = causal.summarise(trace, rows=rows)
    c.causal = summary.to_dict() if summary is not None else None
    return c


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _ns(x) -> str:
    if x is None:
        return "-"
    for unit, name in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
        if x >= unit:
            return f"{x / unit:.3g} {name}"
    return f"{x:.0f} ns"


def _num(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def format_text(c: Characterisation) -> str:
    """The characterisation as aligned lines for a terminal."""
    lines = [
        f"I/Os            {c.ios:,} ({c.reads:,} reads, {c.writes:,} writes, "
        f"{c.discards:,} discards, {c.flushes:,} flushes)",
        f"duration        {_ns(c.duration_ns)}",
        f"read share      {_pct(c.read_share_count)} by count, {_pct(c.read_share_bytes)} by bytes",
        "dominant sizes  " + (", ".join(f"{human_bytes(s, short=True)} ({100 * f:.0f}%)" for s, _, f in c.dominant_sizes) or "-"),
        f"sequential      {_pct(c.sequential_share)} (reads {_pct(c.sequential_read_share)}, "
        f"writes {_pct(c.sequential_write_share)})",
        "inter-arrival   " + (", ".join(f"{k} {_ns(v)}" for k, v in c.interarrival_ns.items()) or "-"),
        "burstiness      " + ("-" if c.peak_to_mean_ios is None else
                              f"inter-arrival CV {_num(c.interarrival_cv)}, busiest window "
                              f"{c.peak_to_mean_ios:.2f}x the mean I/Os"),
    ]
    if c.latency_ns:
        lines.append("latency         " + ", ".join(f"{k} {_ns(v)}" for k, v in c.latency_ns.items()))
        qd = c.queue_depth
        lines.append(f"queue depth     mean {c.mean_queue_depth:.2f}, windows of {_ns(c.queue_depth_window_ns)}: "
                     f"min {min(qd):.2f}, max {max(qd):.2f}")
    lines += [
        f"span            {human_bytes(c.min_offset, short=True)} to {human_bytes(c.span_bytes, short=True)}",
        f"working set     {human_bytes(c.working_set_bytes, short=True)}" + ("" if c.working_set_exact else " (estimate)"),
    ]
    if c.footprint_bytes:
        fp, ws, n = c.footprint_bytes, c.window_working_set_bytes, len(c.footprint_bytes)
        quarters = ", ".join(human_bytes(fp[max(0, -(-n * k // 4) - 1)], short=True) for k in (1, 2, 3, 4))
        lines += [
            f"footprint       at 25/50/75/100% of the duration: {quarters}",
            f"window WS       per {_ns(c.queue_depth_window_ns)} window: mean {human_bytes(int(np.mean(ws)), short=True)}, "
            f"max {human_bytes(max(ws), short=True)}" + ("" if c.window_working_set_exact else " (estimates)"),
        ]
    rate = "" if c.reuse_sample_rate == 1 else f", sampled at 1/{1 / c.reuse_sample_rate:g}"
    lines += [
        "reuse distance  " + (", ".join(f"{k} {human_bytes(v, short=True)}" for k, v in c.reuse_distance_bytes.items()) or "-")
        + f"; cold {_pct(c.reuse_cold_share)} of block accesses{rate}",
        "size histogram  " + ("  ".join(f"{k}: {v['read']}r/{v['write']}w" for k, v in c.size_histogram.items()) or "-"),
    ]
    from analysis import causal

    lines += causal.format_text(causal.CausalSummary(**c.causal) if c.causal else None, _ns)
    return "\n".join(lines)
