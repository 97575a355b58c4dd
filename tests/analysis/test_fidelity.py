"""Fidelity: kernels and the streamed measures against NumPy references written from
the definitions in docs/results.md (Fidelity), then real replays of a trace that carries latency_ns."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.fidelity import (
    BOUNDS_NS, FidelityBuilder, SignedHistogram, _OpenIntervals, count_reordered, fidelity,
    sort_by_issue,
)
from analysis.histogram import LatencyHistogram
from analysis.results import load
from replay.runner import RunOptions, replay
from traces.schema import Op
from traces.trace import read_trace, write_trace

ints = st.integers(-(10**12), 10**12)


@settings(deadline=None)
@given(st.lists(ints, min_size=1, max_size=200), st.integers(1, 3))
def test_signed_histogram_matches_numpy_percentiles(values, pieces):
    h = SignedHistogram(BOUNDS_NS)
    a = np.array(values, np.int64)
    for part in np.array_split(a, pieces):
        h.add(part)
    assert h.count == len(a) and h.min == a.min() and h.max == a.max()
    assert h.mean == pytest.approx(a.mean(), rel=1e-9, abs=1e-3)
    for q, v in zip((0, 1, 50, 99, 99.9, 100), h.percentiles((0, 1, 50, 99, 99.9, 100))):
        truth = int(np.percentile(a, q, method="inverted_cdf"))
        assert abs(v - truth) <= abs(truth) / 256 + 0.5, q
    d = h.to_dict()
    for b, label in zip(BOUNDS_NS, ("10us", "100us", "1ms")):
        assert d["within"][label] == np.count_nonzero(np.abs(a) <= b) / len(a)


@settings(deadline=None)
@given(st.lists(ints, max_size=200), st.integers(1, 3))
def test_signed_histogram_sides_equal_latency_histograms_of_each_sign(values, pieces):
    """The one-pass kernel counts and sums each sign as LatencyHistogram.add does, to the bit."""
    h = SignedHistogram(BOUNDS_NS)
    neg, pos = LatencyHistogram(), LatencyHistogram()
    for part in np.array_split(np.array(values, np.int64), pieces):
        h.add(part)
        neg.add(-part[part < 0])
        pos.add(part[part >= 0])
    for mine, ref in ((h.neg, neg), (h.pos, pos)):
        assert np.array_equal(mine.counts, ref.counts)
        assert (mine.count, mine.min, mine.max, mine.mean, mine.stddev) == (
            ref.count, ref.min, ref.max, ref.mean, ref.stddev)


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 300)), min_size=1, max_size=120),
       st.integers(1, 8))
def test_inflight_at_starts_matches_brute_force_streamed_in_pieces(pairs, pieces):
    """The in-flight count at each start, carried across pieces (empty intervals and equal
    starts included), against counting straight from the definition."""
    start = np.sort(np.array([p[0] for p in pairs], np.int64))
    end = start + np.array([p[1] for p in pairs], np.int64)
    intervals = _OpenIntervals()
    bounds = np.linspace(0, len(start), pieces + 1).astype(int)
    out = np.concatenate([intervals.counts(start[a:b], end[a:b]) for a, b in zip(bounds[:-1], bounds[1:])])
    want = [int(np.count_nonzero(end[:i] > start[i])) for i in range(len(start))]
    assert out.tolist() == want
    assert sorted(intervals.open.tolist()) == sorted(end[end > start[-1]].tolist())


@settings(deadline=None)
@given(st.lists(st.integers(0, 40), max_size=150), st.sampled_from([0, 3, 10**6]))
def test_sort_by_issue_is_stable_with_or_without_its_fallback(keys, budget):
    """Sorted by issue with ties in their first order, both when the insertion sort finishes
    and when it gives up part way and NumPy's stable sort takes over."""
    issue = np.array(keys, np.int64)
    seq = np.arange(len(issue), dtype=np.int64)
    complete, cap = issue + 7, seq * 2
    arrays = [a.copy() for a in (issue, complete, seq, cap)]
    if not sort_by_issue(*arrays, budget):
        order = np.argsort(arrays[0], kind="stable")
        arrays = [a[order] for a in arrays]
    order = np.lexsort((seq, issue))
    for got, want in zip(arrays, (issue, complete, seq, cap)):
        assert got.tolist() == want[order].tolist()


@settings(deadline=None)
@given(st.lists(st.integers(0, 50), max_size=100))
def test_count_reordered_matches_definition(seq):
    a = np.array(seq, np.int64)
    n, top = count_reordered(a, np.int64(-1))
    want = sum(1 for i in range(len(a)) if i and a[i] < a[:i].max())
    assert n == want
    assert top == (a.max() if len(a) else -1)


def reference(c, speed):
    """Every fidelity measure straight from its definition over whole arrays."""
    ok = c["issue_ns"] >= 0
    out = {"issue_error": (c["issue_ns"] - c["intended_ns"])[ok]}
    iss, ts = c["issue_ns"][ok], c["ts_ns"][ok]
    out["inter_arrival"] = np.diff(iss) - np.rint(np.diff(ts) / speed).astype(np.int64)
    lat = c["latency_ns"]
    end = np.where(lat >= 0, c["ts_ns"] + np.maximum(lat, 0), np.iinfo(np.int64).max)
    captured = np.array([np.count_nonzero(end[:i] > c["ts_ns"][i]) for i in range(len(end))])[ok]
    seq = np.flatnonzero(ok)
    order = np.lexsort((seq, iss))
    s_iss, s_cmp = iss[order], c["complete_ns"][ok][order]
    replayed = np.array([np.count_nonzero(s_cmp[:p] > s_iss[p]) for p in range(len(s_iss))])
    out["inflight_error"] = replayed - captured[order]
    out["replayed_mean"] = replayed.mean() if len(replayed) else None
    s_seq = seq[order]
    out["reordered"] = sum(1 for p in range(1, len(s_seq)) if s_seq[p] < s_seq[:p].max())
    known = lat[ok] >= 0
    device = (c["complete_ns"] - c["issue_ns"])[ok]
    out["latency_error"] = (device - lat[ok])[known]
    return out


@st.composite
def replays(draw):
    """Results in trace order whose issue times jitter by up to 4 rows' spacing, so rows are
    reordered within a chunk but never across one of 4 rows or more (the streamed assumption)."""
    n = draw(st.integers(1, 80))
    gap = draw(st.integers(1, 1000))
    ts = np.cumsum(draw(st.lists(st.integers(0, 3000), min_size=n, max_size=n))).astype(np.int64)
    speed = draw(st.sampled_from([1.0, 2.0, 0.5]))
    intended = np.rint(ts / speed).astype(np.int64)
    jitter = np.array(draw(st.lists(st.integers(0, 4 * gap - 1), min_size=n, max_size=n)), np.int64)
    issue = np.arange(n, dtype=np.int64) * gap + jitter
    latency = np.array(draw(st.lists(st.integers(0, 20 * gap), min_size=n, max_size=n)), np.int64)
    captured = np.array(draw(st.lists(st.integers(-1, 20 * gap), min_size=n, max_size=n)), np.int64)
    never = np.array(draw(st.lists(st.integers(0, 15), min_size=n, max_size=n))) == 0
    ops = np.array(draw(st.lists(st.sampled_from([0, 1, 3]), min_size=n, max_size=n)), np.uint8)
    length = np.where(ops == Op.FLUSH, 0, 4096).astype(np.int64)
    return speed, {
        "ts_ns": ts, "op": ops, "length": length, "intended_ns": intended,
        "issue_ns": np.where(never, -1, issue), "complete_ns": np.where(never, -1, issue + latency),
        "result": length.copy(), "latency_ns": captured,
    }


def same(h: SignedHistogram, values):
    ref = SignedHistogram()
    ref.add(values)
    return (h.count == ref.count and h.min == ref.min and h.max == ref.max
            and h.percentiles((1, 50, 99, 99.9)) == ref.percentiles((1, 50, 99, 99.9)))


@settings(max_examples=120, deadline=None)
@given(replays(), st.integers(1, 5))
def test_streamed_fidelity_matches_reference(made, pieces):
    speed, c = made
    n = len(c["ts_ns"])
    size = max(4, -(-n // pieces))
    b = FidelityBuilder(speed=speed, with_latency=True)
    before = {k: v.copy() for k, v in c.items()}
    for start in range(0, n, size):
        b.add({k: v[start:start + size] for k, v in c.items()})
    f = b.finish()
    assert all(np.array_equal(c[k], before[k]) for k in c)  # chunks are shared: never sorted in place
    ref = reference(c, speed)
    assert f.rows == n and f.issued == int(np.count_nonzero(c["issue_ns"] >= 0))
    assert same(b.issue_error, ref["issue_error"])
    assert same(b.inter_arrival, ref["inter_arrival"])
    assert same(b.inflight_error, ref["inflight_error"])
    assert same(b.latency_error, ref["latency_error"])
    assert f.ordering["reordered"] == ref["reordered"]
    if f.issued:
        assert f.inflight["replayed_mean"] == pytest.approx(ref["replayed_mean"])


def _trace_with_latency(path, n=4000, gap_ns=50_000):
    rng = np.random.default_rng(7)
    ts = np.arange(n, dtype=np.int64) * gap_ns
    op = rng.choice([Op.READ, Op.WRITE], n, p=[0.7, 0.3]).astype(np.uint8)
    write_trace(path, {"ts_ns": ts, "op": op, "offset": rng.integers(0, 4096, n) * 4096,
                       "length": np.full(n, 4096, np.int64),
                       "latency_ns": rng.integers(20_000, 400_000, n)}, {"name": "lat"})
    return path


def _check_against_reference(results_path):
    cols, meta = read_trace(results_path)
    r = load(results_path)
    f = fidelity(r)
    ref = reference(cols, r.speed)
    assert f.issued == len(cols["ts_ns"])
    assert f.ordering["reordered"] == ref["reordered"]
    assert f.inflight["replayed_mean"] == pytest.approx(ref["replayed_mean"])
    assert f.issue_error["max"] == ref["issue_error"].max()
    assert f.inflight["error"]["max"] == ref["inflight_error"].max()
    assert f.latency["error_ns"]["count"] == len(ref["latency_error"])
    for q in ("p50", "p99"):
        assert f.latency["ratio"][q] == pytest.approx(
            f.latency["replayed_ns"][q] / f.latency["captured_ns"][q])
    assert f.aggregate["read_share"]["relative_error"] == 0.0
    return f


def test_real_null_replay_with_workers_against_reference(tmp_path):
    trace = _trace_with_latency(tmp_path / "lat.parquet")
    out = replay(trace, None, RunOptions(engine="null", timing="afap", workers=2, qd=4),
                 output=tmp_path / "r.parquet").output
    f = _check_against_reference(out)
    assert f.timed is False and "iops" not in f.aggregate
    timed = replay(trace, None, RunOptions(engine="null", speed=4), output=tmp_path / "t.parquet").output
    f = _check_against_reference(timed)
    assert f.timed is True and f.aggregate["run_time_s"]["trace"] == pytest.approx(3999 * 50e-6 / 4)
    assert f.aggregate["iops"]["replay"] > 0


@pytest.mark.loopdev
def test_real_io_uring_replay_on_a_loop_device(tmp_path, loop_device):
    trace = _trace_with_latency(tmp_path / "lat.parquet", n=2000, gap_ns=200_000)
    device = loop_device(64 << 20)
    out = replay(trace, device, RunOptions(speed=1.0), output=tmp_path / "r.parquet").output
    f = _check_against_reference(out)
    assert f.latency["replayed_ns"]["p50"] > 0
    assert f.inflight["replayed_mean"] >= 0
