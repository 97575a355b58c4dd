"""LatencyHistogram and its Numba bin kernel, against plain NumPy references."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from analysis.histogram import (
    FIO_PERCENTILES,
    N_BINS,
    SUB_BITS,
    LatencyHistogram,
    bin_index,
    bin_lower,
    bin_width,
)

INT64_MAX = np.iinfo(np.int64).max
# Light: two shared cores. No deadline: the first call may load the Numba cache.
light = settings(max_examples=60, deadline=None)


def ref_bin_index(values):
    """NumPy reference: highest set bit by counting non-zero right shifts, no clz, no floats."""
    v = np.asarray(values, dtype=np.int64)
    msb = ((v[:, None] >> np.arange(63, dtype=np.int64)) > 0).sum(axis=1) - 1
    shift = np.maximum(msb - SUB_BITS, 0)
    return shift * (1 << SUB_BITS) + (v >> shift)


def ref_percentile(values, q):
    """numpy's nearest-rank percentile."""
    return int(np.percentile(np.asarray(values), q, method="inverted_cdf"))


def edge_values():
    out = {0, 1, 127, 128, 129, 255, 256, 257, INT64_MAX, INT64_MAX - 1}
    for b in range(1, 63):
        out |= {(1 << b) - 1, 1 << b, (1 << b) + 1}
    return np.array(sorted(out), dtype=np.int64)


def kernel_bins(values):
    return np.array([bin_index(np.int64(v)) for v in values], dtype=np.int64)


def test_bin_index_matches_reference_on_edges():
    v = edge_values()
    np.testing.assert_array_equal(kernel_bins(v), ref_bin_index(v))
    assert bin_index(np.int64(INT64_MAX)) == N_BINS - 1
    assert [bin_index(np.int64(x)) for x in (0, 1, 127, 128, 129, 255, 256)] == [
        0, 1, 127, 128, 129, 255, 256,
    ]


def test_bin_index_matches_reference_on_random_values():
    rng = np.random.default_rng(7)
    v = np.concatenate([
        rng.integers(0, INT64_MAX, 2000, dtype=np.int64, endpoint=True),
        rng.lognormal(10, 3, 2000).astype(np.int64),
        rng.integers(0, 4096, 1000, dtype=np.int64),
    ])
    np.testing.assert_array_equal(kernel_bins(v), ref_bin_index(v))


def test_bins_tile_int64_with_bounded_width():
    # Every bin starts where the previous ends, the last one ends at int64 max, and no bin
    # wider than 1 is wider than 1/128 of its lower bound.
    lower = np.array([bin_lower(i) for i in range(N_BINS)], dtype=np.int64)
    width = np.array([bin_width(i) for i in range(N_BINS)], dtype=np.int64)
    assert lower[0] == 0
    np.testing.assert_array_equal(lower[1:], lower[:-1] + width[:-1])
    assert int(lower[-1]) + int(width[-1]) - 1 == INT64_MAX
    wide = width > 1
    assert np.all(width[wide] * 128 <= lower[wide])
    v = edge_values()
    idx = ref_bin_index(v)
    assert np.all((lower[idx] <= v) & (v - lower[idx] < width[idx]))


# Heavy-tailed, constant, single-value and full-range arrays.
full_range = hnp.arrays(
    np.int64, st.integers(1, 300), elements=st.integers(0, INT64_MAX)
)
small_values = hnp.arrays(np.int64, st.integers(1, 300), elements=st.integers(0, 5000))


@st.composite
def lognormal(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    sigma = draw(st.floats(0.1, 4.0))
    n = draw(st.integers(1, 2000))
    return np.random.default_rng(seed).lognormal(draw(st.floats(0, 20)), sigma, n).astype(np.int64)


constant = st.builds(
    lambda v, n: np.full(n, v, dtype=np.int64), st.integers(0, INT64_MAX), st.integers(1, 50)
)
single = st.integers(0, INT64_MAX).map(lambda v: np.array([v], dtype=np.int64))
any_values = st.one_of(full_range, small_values, lognormal(), constant, single)


@light
@given(any_values, st.lists(st.floats(0, 100), max_size=5))
def test_percentiles_within_bound_of_nearest_rank(values, extra_qs):
    h = LatencyHistogram()
    h.add(values)
    qs = [0.0, 100.0, *FIO_PERCENTILES, *extra_qs]
    for q, got in zip(qs, h.percentiles(qs)):
        exp = ref_percentile(values, q)
        # The requirement is 1/128; the bin midpoint guarantees 1/256, so test that.
        assert abs(got - exp) * 256 <= exp, (q, got, exp)
        assert h.percentile(q) == got


def test_percentile_exact_where_bins_are_exact():
    values = np.arange(1, 201, dtype=np.int64)
    h = LatencyHistogram()
    h.add(values)
    assert h.percentiles([0, 1, 50, 99, 99.5, 100]) == [1, 2, 100, 198, 199, 200]


def test_percentile_reports_bin_midpoint():
    # 1000 and 1001 share the bin [1000, 1004), width 4: the midpoint reported is 1001,
    # and the extremes are the exact min and max.
    h = LatencyHistogram()
    h.add(np.array([1000, 1000, 1000, 1003, 5000], dtype=np.int64))
    assert bin_lower(bin_index(np.int64(1003))) == 1000 and bin_width(bin_index(np.int64(1000))) == 4
    assert h.percentile(50) == 1001
    assert h.percentile(0) == 1000 and h.percentile(100) == 5000


def hist_of(values):
    h = LatencyHistogram()
    h.add(values)
    return h


def assert_same_hist(a, b):
    np.testing.assert_array_equal(a.counts, b.counts)
    assert (a.count, a.min, a.max) == (b.count, b.min, b.max)
    assert math.isclose(a.mean, b.mean, rel_tol=1e-12)
    assert math.isclose(a.stddev, b.stddev, rel_tol=1e-9, abs_tol=abs(a.mean) * 1e-12)


@light
@given(any_values, any_values)
def test_merge_equals_histogram_of_concatenation(a, b):
    h = hist_of(a)
    h.merge(hist_of(b))
    assert_same_hist(h, hist_of(np.concatenate([a, b])))


@light
@given(any_values, st.lists(st.integers(0, 2000), max_size=6))
def test_chunked_add_equals_add_at_once(values, cuts):
    h = LatencyHistogram()
    for part in np.split(values, sorted(c % (len(values) + 1) for c in cuts)):
        h.add(part)
    assert_same_hist(h, hist_of(values))


@light
@given(any_values)
def test_stats_match_numpy(values):
    h = hist_of(values)
    as_float = values.astype(np.float64)
    assert h.count == len(values)
    assert h.min == int(values.min()) and h.max == int(values.max())
    assert math.isclose(h.mean, float(np.mean(as_float)), rel_tol=1e-12)
    exp_std = float(np.std(as_float, ddof=1)) if len(values) > 1 else 0.0
    assert math.isclose(h.stddev, exp_std, rel_tol=1e-7, abs_tol=float(values.max()) * 1e-12)


def test_stddev_keeps_precision_far_from_zero():
    # A running sum of squares would cancel here: values ~1e15 with a spread of 1 ns.
    values = np.array([10**15, 10**15 + 1] * 500, dtype=np.int64)
    h = LatencyHistogram()
    for part in np.split(values, 10):
        h.add(part)
    assert math.isclose(h.stddev, float(np.std(values - 10**15, ddof=1)), rel_tol=1e-9)


def test_negative_value_raises_and_leaves_histogram_unchanged():
    h = hist_of(np.array([5, 500, 50_000], dtype=np.int64))
    before = h.counts.copy()
    with pytest.raises(ValueError, match="negative latency -3"):
        h.add(np.array([7, 70_000, -3, 9], dtype=np.int64))
    np.testing.assert_array_equal(h.counts, before)
    assert (h.count, h.min, h.max) == (3, 5, 50_000)


def test_rejects_floats_and_out_of_range_q():
    h = LatencyHistogram()
    with pytest.raises(TypeError):
        h.add(np.array([1.5]))
    h.add(np.array([1], dtype=np.uint32))
    with pytest.raises(ValueError):
        h.percentile(100.5)
    with pytest.raises(ValueError):
        h.add(np.array([2**63], dtype=np.uint64))


def test_empty_histogram_reports_none():
    h = LatencyHistogram()
    h.add(np.array([], dtype=np.int64))
    assert h.count == 0
    assert (h.min, h.max, h.mean, h.stddev, h.percentile(50)) == (None,) * 5
