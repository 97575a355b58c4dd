"""The suite's scores (analysis/suite.py) against values computed by hand for a tiny results
set made here: two workloads, a handful of I/Os each, an idle gap past the 25 ms cap, a failed
write and a row that was never issued."""
import math

import numpy as np
import pytest

from analysis import suite
from traces.schema import Op

MS = 1_000_000
R, W, F = int(Op.READ), int(Op.WRITE), int(Op.FLUSH)


def columns(rows):
    names = ("op", "ts_ns", "latency_ns", "intended_ns", "issue_ns", "complete_ns", "result")
    return {n: np.array([r[i] for r in rows], dtype=np.uint8 if n == "op" else np.int64)
            for i, n in enumerate(names)}


# op, ts_ns, latency_ns (captured), intended_ns, issue_ns, complete_ns, result
A = columns([
    (R, 0, 1 * MS, 0, 0, 1 * MS, 4096),                          # read 1 ms
    (W, 2 * MS, 2 * MS, 2 * MS, 2 * MS, 4 * MS, 8192),           # write 2 ms
    (R, 3 * MS, MS // 2, 3 * MS, 3_500_000, 5 * MS, 4096),       # read 1.5 ms, overlaps the write
    (F, 100 * MS, 10 * MS, 50 * MS, 50 * MS, 54 * MS, 0),        # a flush after 45 ms idle
])
B = columns([
    (R, 0, 100_000, 0, 10_000, 110_000, 4096),                   # read 100 us
    (R, 0, 100_000, 0, 20_000, 320_000, 4096),                   # read 300 us
    (W, 1 * MS, 200_000, 1 * MS, 1 * MS, 1_200_000, -5),         # write failed (EIO)
    (W, 1_100_000, 200_000, 1_100_000, 1_100_000, 1_500_000, 4096),  # write 400 us
    (R, 2 * MS, 100_000, 2 * MS, -1, -1, -1),                    # never issued (a stopped run)
])


def test_busy_time_caps_each_idle_gap_at_25_ms():
    # Issues 0, 10, 100 ms; each I/O 1 ms: gaps of 9 ms (kept) and 89 ms (25 ms counted).
    assert suite.busy_ns([0, 10 * MS, 100 * MS], [1 * MS, 11 * MS, 101 * MS]) == 101 * MS - 64 * MS
    # Overlapping I/Os leave no gap, whatever order the rows come in: 0-5 ms and 1-3 ms.
    assert suite.busy_ns([1 * MS, 0], [3 * MS, 5 * MS]) == 5 * MS
    assert suite.busy_ns([0, 30 * MS], [1 * MS, 31 * MS], idle_cap_ns=0) == 2 * MS
    assert suite.busy_ns([], []) == 0


def test_nearest_rank_p99():
    assert suite.nearest_rank(range(1, 201)) == 198  # ceil(200 * 0.99) = 198th value
    assert suite.nearest_rank([5, 1]) == 5  # ceil(1.98) = 2nd
    assert suite.nearest_rank([7]) == 7
    assert suite.nearest_rank([]) is None


def test_workload_a_by_hand():
    w = suite.score_workload("a", A)
    assert w.ios == 4
    assert w.bytes == 4096 + 8192 + 4096
    # Busy: issues 0, 2, 3.5, 50 ms; in flight until 1, 4, 5, 54 ms: gaps 1 ms and 45 ms;
    # 54 ms - (45 - 25) ms = 34 ms.
    assert w.busy_ns == 34 * MS
    assert w.data_rate == pytest.approx(16384 / 0.034)  # 481,882 B/s
    # Run time: last completion 54 ms - first intended 0; capture: 100 + 10 ms (the flush).
    assert w.run_time_ns == 54 * MS and w.capture_ns == 110 * MS
    assert w.run_time_ratio == pytest.approx(54 / 110)
    assert (w.read.ios, w.read.mean_ns, w.read.p99_ns) == (2, 1.25 * MS, 1_500_000)
    assert (w.write.ios, w.write.mean_ns, w.write.p99_ns) == (1, 2.0 * MS, 2 * MS)
    assert w.access.mean_ns == pytest.approx(1.5 * MS)  # (1 + 2 + 1.5) / 3 ms; the flush is not an access


def test_workload_b_by_hand():
    w = suite.score_workload("b", B)
    assert w.ios == 4  # the row never issued is not counted
    assert w.bytes == 3 * 4096  # the failed write moved nothing
    # Issues 10, 20, 1000, 1100 us; in flight until 110, 320, 1200, 1500 us: one gap of
    # 680 us, under the cap: 1500 - 10 us.
    assert w.busy_ns == 1_490_000
    assert w.data_rate == pytest.approx(12288 / 1.49e-3)  # 8,246,980 B/s
    # First intended 0 to last completion 1.5 ms; capture: 1.1 + 0.2 ms.
    assert w.run_time_ns == 1_500_000 and w.capture_ns == 1_300_000
    assert w.run_time_ratio == pytest.approx(1.5 / 1.3)
    assert (w.read.mean_ns, w.read.p99_ns) == (200_000, 300_000)
    assert (w.write.ios, w.write.mean_ns, w.write.p99_ns) == (1, 400_000, 400_000)
    assert w.access.mean_ns == pytest.approx((100_000 + 300_000 + 400_000) / 3)


def test_overall_row_and_composite_by_hand():
    s = suite.score_suite("/dev/x", "causal", [("a", A, False), ("b", B, True)])
    o = s.overall
    assert (o.ios, o.bytes) == (8, 28672)
    assert (o.run_time_ns, o.capture_ns) == (55_500_000, 111_300_000)
    assert o.busy_ns == 35_490_000
    assert o.data_rate == pytest.approx(28672 / 0.03549)
    # Reads of both: 1, 1.5, 0.1, 0.3 ms: mean 0.725 ms, p99 the 4th of 4: 1.5 ms.
    assert (o.read.mean_ns, o.read.p99_ns) == (725_000, 1_500_000)
    # Writes: 2 ms and 0.4 ms: mean 1.2 ms.
    assert (o.write.mean_ns, o.write.p99_ns) == (1_200_000, 2 * MS)
    assert o.access.mean_ns == pytest.approx(5_300_000 / 6)
    assert o.partial  # b is partial
    # Geometric mean of a: 0.4818824 MB/s and 1 / 1.5 ms; b: 8.2469799 MB/s and 1 / 0.2666667 ms.
    by_hand = (0.48188235 * (1 / 1.5) * 8.24697987 * 3.75) ** 0.25  # = 1.7754
    assert s.composite == pytest.approx(by_hand, rel=1e-6)
    assert math.isclose(s.composite, 1.7754, rel_tol=1e-4)
    table = s.format_table()
    assert "b *" in table and "composite (ours" in table


def test_a_workload_without_data_has_no_composite():
    only_flush = columns([(F, 0, MS, 0, 0, MS, 0)])
    s = suite.score_suite("t", "causal", [("f", only_flush, False)])
    assert s.composite is None and s.workloads[0].read.mean_ns is None
    with pytest.raises(ValueError):
        suite.score_workload("none", columns([(R, 0, 1, 0, -1, -1, -1)]))
