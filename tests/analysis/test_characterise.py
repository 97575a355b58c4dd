"""Trace characterisation: each Numba kernel against a plain NumPy reference, and the whole
characterisation against direct computations on the trace's columns, in any chunking.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis import characterise as ch
from traces.schema import Op
from traces.trace import open_trace, write_trace

KIB = 1024


def _ios(draw_ops, offsets, lengths):
    return (np.array(draw_ops, np.uint8), np.array(offsets, np.int64), np.array(lengths, np.int64))


io_lists = st.lists(st.tuples(st.sampled_from([0, 0, 1, 1, 2, 3]), st.integers(0, 64),
                              st.sampled_from([0, 1, 2, 8])), max_size=80)


def sequential_reference(op, offset, length):
    """Per direction: I/Os whose offset equals the previous same-direction I/O's end."""
    counts = np.zeros(2, np.int64)
    for d in (0, 1):
        sel = op == d
        ends = (offset + length)[sel]
        counts[d] = int(np.count_nonzero(offset[sel][1:] == ends[:-1]))
    return counts


@settings(max_examples=200, deadline=None)
@given(io_lists, st.integers(1, 10))
def test_sequential_kernel_matches_numpy_in_any_chunking(ios, step):
    op, offset, length = _ios([o for o, _, _ in ios], [b * 4096 for _, b, _ in ios],
                              [n * 4096 for _, _, n in ios])
    last_end = np.full(2, -1, np.int64)
    counts = np.zeros(2, np.int64)
    for start in range(0, len(op), step):
        sl = slice(start, start + step)
        ch.sequential_kernel(op[sl], offset[sl], length[sl], last_end, counts)
    assert counts.tolist() == sequential_reference(op, offset, length).tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(-1, 400)), max_size=50),
       st.integers(1, 300), st.integers(1, 8))
def test_qd_kernel_matches_numpy_overlaps(ios, window, windows):
    ts = np.sort(np.array([t for t, _ in ios], np.int64))
    lat = np.array([lat for _, lat in ios], np.int64)
    busy = np.zeros(windows, np.int64)
    ch.qd_kernel(ts, lat, window, busy)
    w_start = np.arange(windows) * window
    start, end = ts[:, None], (ts + np.maximum(lat, 0))[:, None]
    overlap = np.clip(np.minimum(end, w_start + window) - np.maximum(start, w_start), 0, None)
    assert busy.tolist() == overlap.sum(axis=0).tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 40_000)), max_size=60))
def test_mark_blocks_counts_distinct_blocks(ios):
    offset = np.array([o for o, _ in ios], np.int64)
    length = np.array([n for _, n in ios], np.int64)
    bitmap = np.zeros(64, np.uint8)
    new = ch.mark_blocks(offset, length, 12, bitmap)
    touched = [np.arange(o >> 12, ((o + n - 1) >> 12) + 1) for o, n in zip(offset, length) if n > 0]
    reference = np.unique(np.concatenate(touched)) if touched else np.array([], np.int64)
    assert new == len(reference)
    assert np.flatnonzero(np.unpackbits(bitmap, bitorder="little")).tolist() == reference.tolist()


def _splitmix64_np(x):
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def hll_reference(blocks, p):
    h = _splitmix64_np(blocks.astype(np.uint64))
    idx = (h >> np.uint64(64 - p)).astype(np.int64)
    rest = h << np.uint64(p)
    # rank = leading zeros of the remaining 64 - p bits, plus one, capped at 64 - p + 1
    bits = np.array([int(r).bit_length() for r in rest.tolist()])
    rank = np.minimum(64 - bits + 1, 64 - p + 1)
    registers = np.zeros(1 << p, np.uint8)
    np.maximum.at(registers, idx, rank.astype(np.uint8))
    return registers


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 40), st.integers(1, 5 * 4096)), max_size=40))
def test_hll_kernel_matches_numpy_registers(ios):
    offset = np.array([o for o, _ in ios], np.int64)
    length = np.array([n for _, n in ios], np.int64)
    registers = np.zeros(1 << 8, np.uint8)
    ch.hll_kernel(offset, length, 12, 8, registers)
    touched = [np.arange(o >> 12, ((o + n - 1) >> 12) + 1) for o, n in zip(offset, length)]
    blocks = np.concatenate(touched) if touched else np.array([], np.int64)
    assert registers.tolist() == hll_reference(blocks, 8).tolist()


@pytest.mark.parametrize("distinct", [100, 5_000, 300_000])
def test_hll_estimate_is_within_three_standard_errors(distinct):
    blocks = np.random.default_rng(distinct).choice(1 << 34, distinct, replace=False).astype(np.int64)
    registers = np.zeros(1 << ch.HLL_P, np.uint8)
    # Each block twice: repeats must not count.
    offsets = np.concatenate([blocks, blocks]) << 12
    ch.hll_kernel(offsets, np.full(len(offsets), 4096, np.int64), 12, ch.HLL_P, registers)
    assert abs(ch.hll_estimate(registers) - distinct) <= 3 * 0.0081 * distinct + 1


def _trace(tmp_path, n=5000, seed=1, latency=True):
    rng = np.random.default_rng(seed)
    op = rng.choice([Op.READ, Op.WRITE, Op.FLUSH, Op.DISCARD], n, p=[0.6, 0.3, 0.05, 0.05]).astype(np.uint8)
    length = rng.choice([4 * KIB, 8 * KIB, 128 * KIB, 512], n).astype(np.int64)
    length[op == Op.FLUSH] = 0
    offset = rng.integers(0, 1 << 18, n) * 4096
    seq = rng.random(n) < 0.3  # some I/Os continue the previous one
    offset[1:][seq[1:]] = (offset + length)[:-1][seq[1:]]
    offset[op == Op.FLUSH] = 0
    ts = np.cumsum(rng.integers(0, 200_000, n)).astype(np.int64)
    cols = {"ts_ns": ts, "op": op, "offset": offset, "length": length}
    if latency:
        cols["latency_ns"] = rng.integers(10_000, 2_000_000, n).astype(np.int64)
    path = tmp_path / f"t{seed}.parquet"
    write_trace(path, cols, {"name": "t"})
    return path, cols


@pytest.mark.parametrize("rows", [None, 777])
def test_characterise_matches_direct_computation(tmp_path, rows):
    path, c = _trace(tmp_path)
    got = ch.characterise(open_trace(path), rows=rows)
    op, offset, length, ts = c["op"], c["offset"], c["length"], c["ts_ns"]
    reads, writes = op == Op.READ, op == Op.WRITE
    assert got.ios == len(op)
    assert (got.reads, got.writes, got.flushes, got.discards) == (
        reads.sum(), writes.sum(), (op == Op.FLUSH).sum(), (op == Op.DISCARD).sum())
    assert got.read_share_count == pytest.approx(reads.sum() / (reads | writes).sum())
    assert got.read_share_bytes == pytest.approx(length[reads].sum() / length[reads | writes].sum())
    sizes, counts = np.unique(length[reads | writes], return_counts=True)
    assert got.dominant_sizes[0][0] == sizes[counts.argmax()]
    seq = sequential_reference(op, offset, length)
    assert got.sequential_share == pytest.approx(seq.sum() / (reads | writes).sum())
    touched = [np.arange(o >> 12, ((o + n - 1) >> 12) + 1) for o, n in zip(offset, length) if n > 0]
    assert got.working_set_bytes == len(np.unique(np.concatenate(touched))) * 4096
    assert got.working_set_exact
    assert got.span_bytes == (offset + length).max()
    assert got.duration_ns == ts[-1]
    p50 = np.percentile(np.diff(ts), 50, method="inverted_cdf")
    assert got.interarrival_ns["p50"] == pytest.approx(p50, rel=1 / 128)
    mean_qd = c["latency_ns"].sum() / (got.queue_depth_window_ns * ch.QD_WINDOWS)
    assert got.mean_queue_depth == pytest.approx(mean_qd, rel=0.01)
    assert len(got.queue_depth) == ch.QD_WINDOWS
    hist_total = sum(v["read"] + v["write"] for v in got.size_histogram.values())
    assert hist_total == (reads | writes).sum()
    assert got.size_histogram["<=4 KiB"]["read"] == (reads & (length > 512) & (length <= 4096)).sum()


def test_working_set_falls_back_to_hyperloglog_for_huge_spans(tmp_path):
    path, c = _trace(tmp_path, n=20_000, seed=2, latency=False)
    exact = ch.characterise(open_trace(path))
    estimate = ch.characterise(open_trace(path), max_bitmap_blocks=1000)
    assert not estimate.working_set_exact
    assert estimate.working_set_bytes == pytest.approx(exact.working_set_bytes, rel=3 * 0.0081)
    assert estimate.latency_ns == {} and estimate.queue_depth == []


def test_empty_trace(tmp_path):
    path = tmp_path / "empty.parquet"
    write_trace(path, {"ts_ns": np.array([], np.int64), "op": np.array([], np.uint8),
                       "offset": np.array([], np.int64), "length": np.array([], np.int64)}, {})
    got = ch.characterise(open_trace(path))
    assert (got.ios, got.read_share_count, got.working_set_bytes, got.dominant_sizes) == (0, None, 0, [])
    assert "I/Os            0" in ch.format_text(got)


# ---------------------------------------------------------------------------------------
# Burstiness, footprint and working set over time, reuse distance
# ---------------------------------------------------------------------------------------

def _block_accesses(offset, length):
    """Every 4 KiB block access in order, as (row, block)."""
    return [(i, b) for i, (o, n) in enumerate(zip(offset.tolist(), length.tolist())) if n > 0
            for b in range(o >> 12, ((o + n - 1) >> 12) + 1)]


def reuse_reference(blocks):
    """LRU stack distances (distinct other blocks since the last access; None when cold)."""
    last, out = {}, []
    for i, b in enumerate(blocks):
        out.append(len(set(blocks[last[b] + 1:i])) if b in last else None)
        last[b] = i
    return out


def _write(tmp_path, ts, op, offset, length, name="h"):
    path = tmp_path / f"{name}.parquet"
    write_trace(path, {"ts_ns": np.asarray(ts, np.int64), "op": np.asarray(op, np.uint8),
                       "offset": np.asarray(offset, np.int64), "length": np.asarray(length, np.int64)}, {})
    return path


traces_small = st.lists(st.tuples(st.integers(0, 5_000), st.sampled_from([0, 1, 1, 2, 3]),
                                  st.integers(0, 40), st.sampled_from([512, 4096, 8192, 12288])),
                        min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(traces_small, st.integers(1, 7), st.sampled_from([None, 5]), st.booleans())
def test_new_figures_match_brute_force(tmp_path_factory, ios, windows, rows, small_tables):
    ts = np.cumsum([t for t, _, _, _ in ios])
    op = np.array([o for _, o, _, _ in ios])
    # Flushes are empty at offset 0; a 512-byte I/O sits inside its block.
    offset = np.array([0 if o == Op.FLUSH else b * 4096 + (100 if n == 512 else 0)
                       for _, o, b, n in ios], np.int64)
    length = np.array([0 if o == Op.FLUSH else n for _, o, _, n in ios], np.int64)
    path = _write(tmp_path_factory.mktemp("h"), ts, op, offset, length)
    # small_tables: a tiny reuse table (sampled, so only the cold share's bounds hold).
    got = ch.characterise(open_trace(path), windows=windows, rows=rows,
                          reuse_max_blocks=4 if small_tables else 1 << 20)

    gaps = np.diff(ts).astype(float)
    if len(gaps) and gaps.mean() > 0:
        std = gaps.std(ddof=1) if len(gaps) > 1 else 0.0
        assert got.interarrival_cv == pytest.approx(std / gaps.mean(), rel=1e-9, abs=1e-12)
    window_ns = max(1, -(-max(int(ts[-1]), 1) // windows))
    win = np.minimum(ts // window_ns, windows - 1)
    per_window = np.bincount(win, minlength=windows)
    assert got.ios_per_window == per_window.tolist()
    assert got.peak_to_mean_ios == pytest.approx(per_window.max() / (len(ts) / windows))

    accesses = _block_accesses(offset, length)
    seen, within = set(), [set() for _ in range(windows)]
    footprint = []
    for w in range(windows):
        for row, b in accesses:
            if win[row] == w:
                seen.add(b)
                within[w].add(b)
        footprint.append(len(seen) * 4096)
    assert got.footprint_bytes == footprint
    assert got.window_working_set_bytes == [len(s) * 4096 for s in within]
    assert got.footprint_bytes[-1] == got.working_set_bytes
    assert got.window_working_set_exact

    distances = reuse_reference([b for _, b in accesses])
    warm = np.array([d for d in distances if d is not None], np.int64)
    if small_tables:
        assert got.reuse_sample_rate <= 1 and (got.reuse_cold_share is None) == (not accesses)
        return
    assert got.reuse_sample_rate == 1.0
    assert got.reuse_cold_share == (pytest.approx(1 - len(warm) / len(distances)) if distances else None)
    if len(warm):
        want = {f"p{q:g}": int(np.percentile(warm, q, method="inverted_cdf")) * 4096 for q in (50, 90, 99)}
        assert got.reuse_distance_bytes == want  # distances under 256 blocks are binned exactly
    else:
        assert got.reuse_distance_bytes == {}


def test_interarrival_cv_is_one_for_poisson_and_large_for_bursts(tmp_path):
    rng = np.random.default_rng(3)
    poisson = np.cumsum(rng.exponential(100_000, 50_000)).astype(np.int64)
    bursts = np.sort(np.concatenate([t + rng.integers(0, 1000, 500) for t in range(0, 10**9, 10**7)]))
    n = len(poisson)
    got = ch.characterise(open_trace(_write(tmp_path, poisson, np.zeros(n), np.zeros(n), np.full(n, 4096), "p")))
    assert got.interarrival_cv == pytest.approx(1.0, abs=0.03)
    assert got.peak_to_mean_ios < 1.5
    n = len(bursts)
    got = ch.characterise(open_trace(_write(tmp_path, bursts, np.zeros(n), np.zeros(n), np.full(n, 4096), "b")))
    assert got.interarrival_cv > 5


def _cyclic_scan(tmp_path, n_blocks, passes):
    n = n_blocks * passes
    offset = np.tile(np.arange(n_blocks, dtype=np.int64) * 4096, passes)
    return _write(tmp_path, np.arange(n) * 1000, np.zeros(n), offset, np.full(n, 4096), "cyclic")


def test_reuse_distance_of_a_cyclic_scan_exact_and_sampled(tmp_path):
    n_blocks, passes = 20_000, 4
    path = _cyclic_scan(tmp_path, n_blocks, passes)
    exact = ch.characterise(open_trace(path), rows=7_000)
    want = (n_blocks - 1) * 4096
    assert exact.reuse_sample_rate == 1.0
    assert exact.reuse_cold_share == pytest.approx(1 / passes)
    for v in exact.reuse_distance_bytes.values():  # one distance; bins are within 1/128
        assert v == pytest.approx(want, rel=1 / 128)
    # At most 500 tracked blocks: the rate halves to 1/64 (about 310 of 20,000 blocks kept).
    sampled = ch.characterise(open_trace(path), rows=7_000, reuse_max_blocks=500)
    assert sampled.reuse_sample_rate == 1 / 64
    assert sampled.reuse_cold_share == pytest.approx(1 / passes, abs=0.02)
    for v in sampled.reuse_distance_bytes.values():
        assert v == pytest.approx(want, rel=0.15)


def test_reuse_table_compaction_keeps_distances_exact():
    # Tree of 64 slots, 1000 accesses: the times are renumbered many times over.
    blocks = np.random.default_rng(5).integers(0, 12, 1000)
    last = ch.Dict.empty(ch.types.int64, ch.types.int64)
    tree = np.zeros(64, np.int64)
    state = np.array([0, 1 << ch.SHARDS_BITS, 16, 0, -1, 0], np.int64)
    hist = np.zeros(ch.N_BINS, np.int64)
    # Read-only columns, as characterise passes them from Arrow: the one specialisation. Two
    # processes compiling different ones at once can swap them in Numba's on-disk cache,
    # whose files are numbered per specialisation (a fresh-clone CI run read wrong distances).
    offset, length = blocks << 12, np.full(1000, 4096, np.int64)
    offset.flags.writeable = length.flags.writeable = False
    ch.reuse_kernel(offset, length, 12, last, tree, state, hist)
    reference = reuse_reference(blocks.tolist())
    warm = [d for d in reference if d is not None]
    assert state[3] == len(reference) - len(warm)
    assert hist[:16].tolist() == np.bincount(warm, minlength=16).tolist()


def test_window_working_set_falls_back_to_hyperloglog(tmp_path):
    path, _ = _trace(tmp_path, n=20_000, seed=4, latency=False)
    exact = ch.characterise(open_trace(path), windows=10)
    estimate = ch.characterise(open_trace(path), windows=10, max_stamp_blocks=1000, max_bitmap_blocks=1000)
    assert exact.window_working_set_exact and not estimate.window_working_set_exact
    for e, x in zip(estimate.window_working_set_bytes, exact.window_working_set_bytes):
        assert e == pytest.approx(x, rel=4 * 0.0081)
    for e, x in zip(estimate.footprint_bytes, exact.footprint_bytes):
        assert e == pytest.approx(x, rel=4 * 0.0081)


def test_bundled_traces_characterise_with_the_new_figures():
    from traces.library import available, resolve
    assert available()
    for name in available():
        got = ch.characterise(open_trace(resolve(name)))
        assert len(got.footprint_bytes) == ch.QD_WINDOWS
        assert got.footprint_bytes[-1] == got.working_set_bytes
        assert max(got.window_working_set_bytes) <= got.working_set_bytes
        assert got.interarrival_cv > 0 and got.peak_to_mean_ios >= 1
        assert 0 < got.reuse_cold_share <= 1
        assert "reuse distance" in ch.format_text(got)
