"""The numbers each chart of a results set shows, checked against values worked out by hand
from small hand-made tables and latencies: seed 004's one bar chart per test, seed 000's
70/30 bar beside the sweep, seed 001's six-mix average, seed 002's latency distribution, and
the score labels the report and the console print."""
import pytest

from analysis import bench_charts, score_labels
from analysis.scoring import (LATENCY_RANGES_NS, consistency, consistency_bins,
                              latency_distribution)
from tests.analysis.test_scoring import MS, S, chunk, ios


def row(share, mb, split="1x3", data="random", iops=None):
    workers, qd = (int(x) for x in split.split("x"))
    return {"read_share": share, "mb_per_s": mb, "iops": mb * 256 if iops is None else iops,
            "split": split, "qd": qd, "workers": workers, "data": data}


# Seed 004 as run: QD3 writes (random, then pseudo-random data), the same at QD32, QD3 reads.
SEED_004 = [row(0.0, 60.0), row(0.0, 90.0, data="compressible:50"), row(0.0, 70.0, "1x32"),
            row(0.0, 110.0, "1x32", "compressible:50"), row(1.0, 40.0)]
# Seed 000 as run: one sweep at 32 workers x QD1, the six shares and 70/30 last.
SEED_000 = [row(s, mb, "32x1") for s, mb in
            ((1.0, 600.0), (0.8, 500.0), (0.6, 400.0), (0.4, 300.0), (0.2, 200.0), (0.0, 120.0),
             (0.7, 450.0))]


def test_seed_004s_points_are_one_bar_chart_per_test_not_a_sweep():
    chart = bench_charts.sweep_chart({"t": SEED_004})
    assert chart.lines == {} and chart.average == {} and chart.headline == {}
    tests = bench_charts.point_charts({"t": SEED_004})
    assert [(c.title, c.bars) for c in tests] == [
        ("4 KiB random writes, QD3", {"t, random data": 60.0, "t, compressible:50 data": 90.0}),
        ("4 KiB random writes, QD32", {"t, random data": 70.0, "t, compressible:50 data": 110.0}),
        ("4 KiB random reads, QD3", {"t, random data": 40.0}),
    ]
    assert [c.name for c in tests] == ["point_1x3_r0", "point_1x32_r0", "point_1x3_r100"]
    assert {c.unit for c in tests} == {"MB/s"}


def test_two_targets_share_each_test_chart():
    other = [{**r, "mb_per_s": r["mb_per_s"] / 2} for r in SEED_004]
    (qd3_writes, *_) = bench_charts.point_charts({"a": SEED_004, "b": other})
    assert qd3_writes.bars == {"a, random data": 60.0, "a, compressible:50 data": 90.0,
                               "b, random data": 30.0, "b, compressible:50 data": 45.0}


def test_seed_000s_70_30_headline_gets_its_bar_beside_the_sweep():
    chart = bench_charts.sweep_chart({"t": SEED_000})
    assert list(chart.lines) == ["t 32 workers x QD1"]
    x, y = chart.lines["t 32 workers x QD1"]
    assert x == [0.0, 0.2, 0.4, 0.6, 0.7, 0.8, 1.0]
    assert y == [120.0, 200.0, 300.0, 400.0, 450.0, 500.0, 600.0]
    assert chart.headline == {"t 32 workers x QD1": 450.0}
    # Seed 001's bar: (600 + 500 + 400 + 300 + 200 + 120) / 6, the 70/30 point left out.
    assert chart.average == {"t 32 workers x QD1": pytest.approx(2120 / 6)}
    assert bench_charts.point_charts({"t": SEED_000}) == []
    iops = bench_charts.sweep_chart({"t": SEED_000}, "iops")
    assert iops.unit == "IOPS" and iops.headline == {"t 32 workers x QD1": 450.0 * 256}


def test_a_sweep_without_all_six_mixes_has_no_average_bar():
    rows = [row(1.0, 10.0), row(0.5, 20.0), row(0.0, 30.0)]
    chart = bench_charts.sweep_chart({"t": rows})
    assert chart.lines == {"t QD3": ([0.0, 0.5, 1.0], [30.0, 20.0, 10.0])}
    assert chart.average == {} and chart.headline == {}


def test_sweeps_are_consecutive_rows_of_one_split_and_data():
    rows = [row(1.0, 1.0), row(0.0, 2.0), row(1.0, 3.0, data="zeros"), row(0.0, 4.0, data="zeros"),
            row(0.5, 5.0)]
    assert [(split, data, [r["mb_per_s"] for r in rs]) for split, data, rs in
            bench_charts.sweeps(rows)] == [("1x3", "random", [1.0, 2.0]),
                                           ("1x3", "zeros", [3.0, 4.0]), ("1x3", "random", [5.0])]
    chart = bench_charts.sweep_chart({"t": rows})
    assert list(chart.lines) == ["t QD3", "t QD3, zeros data"]  # the lone 50 % point is a test
    assert [c.bars for c in bench_charts.point_charts({"t": rows})] == [{"t, random data": 5.0}]


# ---- seed 002: the latency distribution -----------------------------------------------------


def test_the_latency_distribution_counts_the_scored_window_by_range():
    # 4 s; the window is the last 2. Second 0's slow I/Os and second 1's fast ones are outside.
    rows = ios(3, 0, latency_ns=30 * MS) + ios(4, 1, latency_ns=10_000)
    rows += ios(2, 2, latency_ns=30_000)          # <= 50 us
    rows += ios(1, 2, latency_ns=50_000)          # <= 50 us: a range holds its upper edge
    rows += ios(3, 3, latency_ns=150_000)         # 100-200 us
    rows += ios(1, 3, latency_ns=10 * MS)         # 5-10 ms, at the limit, not over it
    rows += ios(2, 3, latency_ns=10 * MS + 1)     # > 10 ms, the consistency warning
    bins = consistency_bins()
    bins.add(chunk(rows))
    dist = latency_distribution(bins, window_s=2, duration_ns=4 * S)
    assert dist["edges_ns"] == list(LATENCY_RANGES_NS)
    assert dist["counts"] == [3, 0, 3, 0, 0, 0, 0, 1, 2]
    ranges = bench_charts.latency_ranges(dist)
    assert [r for r, _ in ranges] == ["<= 50 us", "50-100 us", "100-200 us", "200-500 us",
                                      "500 us-1 ms", "1-2 ms", "2-5 ms", "5-10 ms", "> 10 ms"]
    assert [s for _, s in ranges] == pytest.approx([3 / 9, 0, 3 / 9, 0, 0, 0, 0, 1 / 9, 2 / 9])
    # Its last bar is the consistency score's share over 10 ms, over the same I/Os.
    assert consistency(bins, window_s=2, duration_ns=4 * S).slow_share == pytest.approx(2 / 9)


def test_an_empty_window_has_an_empty_distribution():
    dist = latency_distribution(consistency_bins(), window_s=2, duration_ns=2 * S)
    assert dist["counts"] == [0] * (len(LATENCY_RANGES_NS) + 1)
    assert {s for _, s in bench_charts.latency_ranges(dist)} == {0.0}


# ---- every score's label and unit -------------------------------------------------------------


@pytest.mark.parametrize("key, value, said", [
    ("mb_per_s_r0_1x3_compressible50", 60868.2, "writes QD3, compressible:50 data: 60,868 MB/s"),
    ("mb_per_s_r100_1x3", 40.0, "reads QD3: 40 MB/s"),
    ("mb_per_s_r50_32x1", 40.0, "50 % reads 32 workers x QD1: 40 MB/s"),
    ("iops_70_30_32x1", 33220.4, "70/30 32 workers x QD1: 33,220 IOPS"),
    ("mb_per_s_70_30_1x1_zeros", 1234.0, "70/30 QD1, zeros data: 1,234 MB/s"),
    ("mb_per_s_average_1x3", 2120 / 6, "average of the six mixes, QD3: 353 MB/s"),
    ("slow_share", 0.03, "I/Os over the slow limit in the scored window: 3 %"),
    ("slow_ns", 10_000_000, "slow limit (the consistency warning): 10 ms"),
    ("act_multiple", 40, "ACT: 40x load"),
    ("window_s", 500, "scored window: 500 s"),
])
def test_score_words(key, value, said):
    assert score_labels.words(key, value) == said


def test_the_consistency_label_says_the_formula_is_ours():
    label, unit = score_labels.label("consistency")
    assert "seed 003" in label and "average / standard deviation" in label and unit == ""
    assert score_labels.label("no_such_score") is None


# ---- power and efficiency (--power-log): seed 000's mix sweep and ACT, seed 002's 70/30 -----

B = 1_800_000_000.0  # a Unix second; the hand-made log's samples are at B + 0 .. B + 7


def at(s: float) -> str:
    """Run "started" as results.json keeps it: ISO 8601 with a zone."""
    from datetime import datetime, timezone
    return datetime.fromtimestamp(B + s, timezone.utc).isoformat()


@pytest.fixture
def meter(tmp_path):
    """A meter's log by column name (stamp in Unix seconds, watts): a sample a second."""
    from analysis.power import read_log
    path = tmp_path / "meter.csv"
    watts = (2, 4, 3, 3, 5, 7, 6, 6)
    path.write_text("stamp,watts\n" + "".join(f"{B + i:.1f},{w}\n" for i, w in enumerate(watts)))
    return read_log(path, ("stamp", "watts"))


def test_the_mix_sweeps_power_and_efficiency_from_a_hand_made_log(meter):
    from analysis.power import measure

    # Four 1 s points at B+0, B+2, B+4, B+6 and one at B+20, after the log's end.
    rows = [row(1.0, 300.0, "1x32"), row(0.7, 240.0, "1x32"), row(0.4, 180.0, "1x32"),
            row(0.0, 120.0, "1x32"), row(0.2, 150.0, "1x32")]
    runs = []
    for r, (name, start) in zip(rows, (("a", 0), ("b", 2), ("c", 4), ("d", 6), ("e", 20))):
        r["run"] = name
        summary = {"duration_ns": 1_000_000_000, "mb_per_s": r["mb_per_s"], "iops": r["iops"]}
        runs.append({"name": name, "started": at(start), "power": measure(meter, at(start), summary)})
    table = bench_charts.with_power(rows, runs)
    assert bench_charts.has_power(runs)
    # Trapezoids between samples a second apart: [0, 1] (2 + 4) / 2 = 3 W; [2, 3] 3 W;
    # [4, 5] (5 + 7) / 2 = 6 W; [6, 7] 6 W; the last point is not in the log.
    watts = bench_charts.sweep_chart({"t": table}, "average_w")
    assert watts.unit == "W"
    assert watts.lines == {"t QD32": ([0.0, 0.4, 0.7, 1.0], [6.0, 6.0, 3.0, 3.0])}
    assert watts.headline == {"t QD32": 3.0} and watts.average == {}
    eff = bench_charts.sweep_chart({"t": table}, "mb_per_s_per_w")
    assert eff.unit == "MB/s/W"
    # 120 / 6, 180 / 6, 240 / 3, 300 / 3.
    assert eff.lines == {"t QD32": ([0.0, 0.4, 0.7, 1.0], [20.0, 30.0, 80.0, 100.0])}
    assert eff.headline == {"t QD32": 80.0}
    iops = bench_charts.sweep_chart({"t": table}, "iops_per_w")
    assert iops.unit == "IOPS/W" and iops.headline == {"t QD32": 240.0 * 256 / 3}
    # A set without power draws nothing, and says so to has_power.
    bare = [{**r, "power": None} for r in runs]
    assert not bench_charts.has_power(bare)
    assert bench_charts.sweep_chart({"t": bench_charts.with_power(rows, bare)}, "average_w").lines == {}


def test_an_over_provisioned_pass_finds_its_runs_by_their_prefix():
    rows = [{**row(1.0, 10.0), "run": "1x3-r100"}, {**row(0.0, 20.0), "run": "1x3-r0"}]
    runs = [{"name": "1x3-r100", "power": {"average_w": 9.0}},
            {"name": "op25-1x3-r100", "power": {"average_w": 2.0, "mb_per_s_per_w": 5.0}},
            {"name": "op25-1x3-r0", "power": {"average_w": 4.0, "mb_per_s_per_w": 5.0}}]
    chart = bench_charts.sweep_chart({"t": bench_charts.with_power(rows, runs, "op25-")}, "average_w")
    assert chart.lines == {"t QD3": ([0.0, 1.0], [4.0, 2.0])}


def test_steady_and_act_power_bars_and_their_labels():
    steady = {"read_share": 0.7, "steady_average_w": 5.0, "steady_mb_per_s_per_w": 0.8192}
    act = {"act_multiple": 40.0, "passed": True, "act_average_w": 4.0, "act_mb_per_s_per_w": 12.5}
    chart = bench_charts.steady_power_bars({"a: steady": steady, "b: steady": {"read_share": 0.7}})
    assert chart.bars == {"a: steady, 70 % reads": (5.0, 0.8192)}  # b ran without a log
    chart = bench_charts.act_power_bars({"a: act": act, "b: act": {"act_multiple": 0, "passed": False}})
    assert chart.bars == {"a: act at 40x": (4.0, 12.5)}
    assert score_labels.words("average_w_70_30_32x1", 3.0) == "average power at 70/30 32 workers x QD1: 3 W"
    assert score_labels.words("mb_per_s_per_w_70_30_1x32", 80.0) == "efficiency at 70/30 QD32: 80 MB/s/W"
    assert score_labels.words("steady_mb_per_s_per_w", 0.8192) == \
        "efficiency over the scored window: 0.819 MB/s/W"
    assert score_labels.words("act_average_w", 4.0) == "ACT's average power at its passing multiple: 4 W"
    assert score_labels.words("steady_power_covered", 0.5) == \
        "part of the scored window the power log covers: 50 %"
