"""Time series: the Numba kernels against plain NumPy references on hypothesis-made results,
and a real replay (null engine) whose series must add up to its summary."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.results import load
from analysis.timeseries import N_BINS, SUB_BITS, bin_mid, bin_of, time_series
from replay.runner import RunOptions, replay
from traces.schema import Op

SUB = 1 << SUB_BITS


def ref_bin(v):
    """Histogram bin by its definition: exact below 2*SUB, then SUB sub-buckets per power of 2."""
    if v < 2 * SUB:
        return v
    b = int(v).bit_length() - 1
    if b > 43:
        return N_BINS - 1
    shift = b - SUB_BITS
    return shift * SUB + (v >> shift)


@settings(deadline=None)
@given(st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=50))
def test_bin_of_matches_its_definition(values):
    for v in values:
        assert bin_of(np.int64(v)) == ref_bin(v)
        j = ref_bin(v)
        if v < 2**44:
            assert abs(int(bin_mid(j)) - v) <= v / (2 * SUB)


@st.composite
def results(draw):
    n = draw(st.integers(1, 60))
    op = draw(st.lists(st.sampled_from([int(o) for o in Op]), min_size=n, max_size=n))
    intended = draw(st.lists(st.integers(0, 5_000), min_size=n, max_size=n))
    late = draw(st.lists(st.integers(-300, 3_000), min_size=n, max_size=n))
    latency = draw(st.lists(st.integers(0, 4_000), min_size=n, max_size=n))
    failed = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    never = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
    intended = np.array(intended, np.int64)
    issue = np.maximum(intended + np.array(late), 0)
    complete = issue + np.array(latency)
    length = np.full(n, 4096, np.int64)
    result = np.where(np.array(failed), -5, length)
    issue = np.where(np.array(never) == 0, -1, issue)  # a few rows never issued
    return {"op": np.array(op, np.uint8), "length": length, "intended_ns": intended,
            "issue_ns": issue, "complete_ns": np.where(issue < 0, -1, complete), "result": result}


def reference(chunk, bin_ns):
    """Straight from the definitions with NumPy, window by window."""
    ok = chunk["issue_ns"] >= 0
    c = {k: v[ok] for k, v in chunk.items()}
    w = c["complete_ns"] // bin_ns
    ws = c["issue_ns"] // bin_ns
    n = int(w.max()) + 1 if len(w) else 0
    out = {"count": np.bincount(w, minlength=n),
           "bytes": np.bincount(w, weights=np.maximum(c["result"], 0), minlength=n),
           "inflight": np.zeros(n), "device": [], "workload": [], "late": []}
    dev = c["complete_ns"] - c["issue_ns"]
    work = c["complete_ns"] - np.minimum(c["intended_ns"], c["issue_ns"])
    late = np.maximum(c["issue_ns"] - c["intended_ns"], 0)
    for i in range(n):
        lo, hi = i * bin_ns, (i + 1) * bin_ns
        overlap = np.minimum(c["complete_ns"], hi) - np.maximum(c["issue_ns"], lo)
        out["inflight"][i] = np.maximum(overlap, 0).sum() / bin_ns
        out["device"].append(dev[w == i])
        out["workload"].append(work[w == i])
        out["late"].append(late[ws == i])
    return out


def close(estimate, values, q):
    if len(values) == 0:
        return np.isnan(estimate)
    truth = np.percentile(values, q, method="inverted_cdf")
    return abs(estimate - truth) <= truth / (2 * SUB) and estimate <= values.max()


@settings(max_examples=150, deadline=None)
@given(results(), st.sampled_from([1, 7, 500, 1000, 100_000]), st.integers(1, 4))
def test_series_matches_numpy_reference(chunk, bin_ns, pieces):
    n = len(chunk["op"])
    bounds = np.linspace(0, n, pieces + 1).astype(int)
    chunks = [{k: v[a:b] for k, v in chunk.items()} for a, b in zip(bounds[:-1], bounds[1:])]
    ts = time_series(chunks, bin_ns=bin_ns)
    ref = reference(chunk, bin_ns)
    m = len(ref["count"])
    assert len(ts) == m
    assert ts.not_issued == int(np.count_nonzero(chunk["issue_ns"] < 0))
    assert np.array_equal(ts.counts["all"], ref["count"])
    assert np.allclose(ts.mb_per_s["all"], ref["bytes"] * (1e9 / bin_ns) / 1e6)
    assert np.allclose(ts.inflight, ref["inflight"])
    assert np.allclose(ts.t_s, np.arange(m) * bin_ns / 1e9)
    for name, key in (("device", "device"), ("workload", "workload"), ("lateness", "late")):
        series = getattr(ts, name)
        for i in range(m):
            values = ref[key][i]
            for q, label in ((50, "p50"), (99, "p99"), (99.9, "p99.9")):
                assert close(series[label][i], values, q), (name, i, label)
            if len(values):
                assert series["max"][i] == values.max()
            else:
                assert np.isnan(series["max"][i])
    for k, o in enumerate(Op):
        mine = chunk["op"][chunk["issue_ns"] >= 0] == k
        assert ts.counts[o.name.lower()].sum() == np.count_nonzero(mine)


def test_bad_chunks_are_refused():
    good = {"op": np.array([0], np.uint8), "length": np.array([1]), "intended_ns": np.array([0]),
            "issue_ns": np.array([5]), "complete_ns": np.array([3]), "result": np.array([1])}
    with pytest.raises(ValueError, match="completed before it was issued"):
        time_series([good])
    with pytest.raises(ValueError, match="lacks column"):
        time_series([{"op": good["op"]}])
    with pytest.raises(ValueError, match="op codes"):
        time_series([{**good, "op": np.array([9], np.uint8), "complete_ns": np.array([9])}])
    with pytest.raises(ValueError, match="bin_ns"):
        time_series([], bin_ns=0)


def test_real_replay_series_adds_up_to_its_summary(tmp_path):
    out = replay("demo", None, RunOptions(engine="null", speed=20), output=tmp_path / "r.parquet").output
    r = load(out)
    ts = time_series(r.chunks(), bin_ns=100_000_000)
    s = r.summary
    for o in Op:
        assert ts.counts[o.name.lower()].sum() == s.ops[o].ios
    assert ts.counts["all"].sum() == s.total().ios > 0
    assert round(ts.mb_per_s["all"].sum() * 1e6 * 0.1) == s.total().bytes
    busy = sum(int((c["complete_ns"] - c["issue_ns"]).sum()) for c in r.chunks(["issue_ns", "complete_ns"]))
    assert ts.inflight.sum() * ts.bin_ns == pytest.approx(busy)
    assert np.nanmax(ts.device["max"]) == s.total().device.max
    d = ts.to_dict()
    assert len(d["iops"]["read"]) == len(d["t_s"]) == len(d["inflight"]) == len(ts)
    assert all(v is None or v >= 0 for v in d["device_latency_ns"]["p99"])


@settings(max_examples=60, deadline=None)
@given(results(), st.sampled_from([(1_000,), (500, 2_000), (0, 100, 3_000)]),
       st.sampled_from([1, 3]), st.sampled_from(["issue", "intended"]))
def test_qos_shares_match_numpy(chunk, thresholds, period_bins, latency_from):
    """QoS from analysis.scoring (kept with the other windowed figures): shares over arbitrary
    thresholds per period, against a direct count."""
    from analysis.scoring import qos, qos_bins

    bin_ns = 1_000
    bins = qos_bins(thresholds, bin_ns=bin_ns, latency_from=latency_from, ops=tuple(Op))
    bins.add(chunk)
    periods = qos(bins, period_s=period_bins * bin_ns / 1e9)
    ok = (chunk["issue_ns"] >= 0) & (chunk["result"] >= 0)
    start = chunk["issue_ns"] if latency_from == "issue" else chunk["intended_ns"]
    latency = (chunk["complete_ns"] - start)[ok]
    period = chunk["complete_ns"][ok] // (bin_ns * period_bins)
    assert sum(p.ios for p in periods) == int(ok.sum())
    for p in periods:
        mine = period == p.index
        for t in thresholds:
            want = np.count_nonzero(latency[mine] > t) / mine.sum() if mine.any() else None
            assert p.shares[t] == want
