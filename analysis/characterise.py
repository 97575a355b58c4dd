"""Characterise a trace in one streaming pass: mix, sizes, sequentiality, timing, queue depth,
span and working set. Memory is bounded whatever the trace's length (a bitmap over the span,
or a HyperLogLog sketch when the span is too large for one).
"""
from dataclasses import asdict, dataclass, field

import numba
import numpy as np

from analysis.histogram import LatencyHistogram
from traces.schema import Op

BLOCK_SHIFT = 12  # working set in 4 KiB blocks
# Largest bitmap kept: 2**29 bits = 64 MiB covers a 2 TiB span; beyond it HyperLogLog.
MAX_BITMAP_BLOCKS = 1 << 29
HLL_P = 14  # 16384 registers: 1.04 / sqrt(16384) = 0.8 % standard error
QD_WINDOWS = 100
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


# ---------------------------------------------------------------------------------------
# Kernels (each tested against a NumPy reference in tests/test_characterise.py)
# ---------------------------------------------------------------------------------------

@numba.njit(nogil=True, cache=True)
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


@numba.njit(nogil=True, cache=True)
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


@numba.njit(nogil=True, cache=True)
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


@numba.njit(nogil=True, cache=True)
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
                 max_bitmap_blocks: int = MAX_BITMAP_BLOCKS) -> Characterisation:
    """Characterise an opened trace (traces.trace.TraceFile) in one pass over chunks of `rows`.

    The working set is exact from a bitmap while the span holds at most `max_bitmap_blocks`
    4 KiB blocks, and a HyperLogLog estimate (0.8 % standard error) beyond.
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
        if use_bitmap:
            blocks += mark_blocks(offset, length, BLOCK_SHIFT, bitmap)
        else:
            hll_kernel(offset, length, BLOCK_SHIFT, HLL_P, registers)

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
    c.min_offset = min_offset
    c.span_bytes = span
    if use_bitmap:
        c.working_set_bytes = blocks << BLOCK_SHIFT
    else:
        c.working_set_bytes = int(round(hll_estimate(registers))) << BLOCK_SHIFT
        c.working_set_exact = False
    return c


def human_bytes(n) -> str:
    if n is None:
        return "-"
    for unit, name in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= unit:
            value = n / unit
            return f"{value:.0f} {name}" if value == int(value) else f"{value:.1f} {name}"
    return f"{n} B"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _ns(x) -> str:
    if x is None:
        return "-"
    for unit, name in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
        if x >= unit:
            return f"{x / unit:.3g} {name}"
    return f"{x:.0f} ns"


def format_text(c: Characterisation) -> str:
    """The characterisation as aligned lines for a terminal."""
    lines = [
        f"I/Os            {c.ios:,} ({c.reads:,} reads, {c.writes:,} writes, "
        f"{c.discards:,} discards, {c.flushes:,} flushes)",
        f"duration        {_ns(c.duration_ns)}",
        f"read share      {_pct(c.read_share_count)} by count, {_pct(c.read_share_bytes)} by bytes",
        "dominant sizes  " + (", ".join(f"{human_bytes(s)} ({100 * f:.0f}%)" for s, _, f in c.dominant_sizes) or "-"),
        f"sequential      {_pct(c.sequential_share)} (reads {_pct(c.sequential_read_share)}, "
        f"writes {_pct(c.sequential_write_share)})",
        "inter-arrival   " + (", ".join(f"{k} {_ns(v)}" for k, v in c.interarrival_ns.items()) or "-"),
    ]
    if c.latency_ns:
        lines.append("latency         " + ", ".join(f"{k} {_ns(v)}" for k, v in c.latency_ns.items()))
        qd = c.queue_depth
        lines.append(f"queue depth     mean {c.mean_queue_depth:.2f}, windows of {_ns(c.queue_depth_window_ns)}: "
                     f"min {min(qd):.2f}, max {max(qd):.2f}")
    lines += [
        f"span            {human_bytes(c.min_offset)} to {human_bytes(c.span_bytes)}",
        f"working set     {human_bytes(c.working_set_bytes)}" + ("" if c.working_set_exact else " (estimate)"),
        "size histogram  " + ("  ".join(f"{k}: {v['read']}r/{v['write']}w" for k, v in c.size_histogram.items()) or "-"),
    ]
    return "\n".join(lines)
