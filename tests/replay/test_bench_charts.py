"""The report's charts of real (null-engine) results sets: what each chart is given, checked
against the set's own scores; two sets of one test under one label; every score in words."""
import pytest

from analysis import bench_charts, plots, report, score_labels
from replay.bench.options import BenchOptions
from replay.bench.presets import preset_options
from replay.bench.scores import format_results
from replay.bench.session import run_bench

MIB = 1 << 20


def spy(monkeypatch, *names) -> dict:
    """{plot function name: [first argument of each call]} as the report draws."""
    drawn = {name: [] for name in names}
    for name in names:
        original = getattr(plots, name)

        def call(data, *args, _name=name, _original=original, **kwargs):
            drawn[_name].append(data)
            return _original(data, *args, **kwargs)

        monkeypatch.setattr(plots, name, call)
    return drawn


def seed004(out):
    test, options = preset_options("seed004-iometer", 0.0003, {"engine": "null", "span": 16 * MIB})
    return run_bench(test, None, out, options)


def test_seed_004_draws_a_bar_chart_per_test_and_no_sweep(tmp_path, monkeypatch):
    results = seed004(tmp_path / "s")
    drawn = spy(monkeypatch, "point_bars", "sweep_mb", "mix_sweep")
    report.build_report([tmp_path / "s"], tmp_path / "r.html", labels=["t"])
    assert drawn["sweep_mb"] == [] and drawn["mix_sweep"] == []  # no line, no empty average panel
    s = results["scores"]
    assert [(c.title, c.bars) for c in drawn["point_bars"]] == [
        ("4 KiB random writes, QD3", {"t: mix, random data": s["mb_per_s_r0_1x3"],
                                      "t: mix, compressible:50 data": s["mb_per_s_r0_1x3_compressible50"]}),
        ("4 KiB random writes, QD32", {"t: mix, random data": s["mb_per_s_r0_1x32"],
                                       "t: mix, compressible:50 data": s["mb_per_s_r0_1x32_compressible50"]}),
        ("4 KiB random reads, QD3", {"t: mix, random data": s["mb_per_s_r100_1x3"]}),
    ]
    files = {p.stem for p in (tmp_path / "r_files").iterdir()}
    assert {"mix_point_1x3_r0", "mix_point_1x32_r0", "mix_point_1x3_r100"} <= files
    page = (tmp_path / "r.html").read_text()
    assert "mb per s" not in page and "writes QD3, compressible:50 data: " in page


def test_two_sets_of_one_test_under_one_label_are_both_drawn(tmp_path, monkeypatch):
    options = BenchOptions(engine="null", span=16 * MIB, duration_s=0.05,
                           sweeps=(((1, 3), (1.0, 0.7, 0.0), "random"),))
    first = run_bench("mix", None, tmp_path / "monday", options)
    second = run_bench("mix", None, tmp_path / "tuesday", options)
    drawn = spy(monkeypatch, "sweep_mb", "mix_sweep")
    report.build_report([tmp_path / "monday", tmp_path / "tuesday"], tmp_path / "r.html",
                        labels=["t", "t"])
    (mb,) = drawn["sweep_mb"]
    assert list(mb.lines) == ["t: mix (monday) QD3", "t: mix (tuesday) QD3"]
    for name, results in zip(mb.lines, (first, second)):
        table = results["scores"]["table"]
        assert mb.lines[name] == ([0.0, 0.7, 1.0], [r["mb_per_s"] for r in table][::-1])
        assert mb.headline[name] == results["scores"]["mb_per_s_70_30_1x3"]
    (iops,) = drawn["mix_sweep"]
    assert list(iops.lines) == list(mb.lines)


def test_the_same_directory_twice_is_numbered(tmp_path, monkeypatch):
    seed004(tmp_path / "s")
    drawn = spy(monkeypatch, "point_bars")
    report.build_report([tmp_path / "s", tmp_path / "s"], tmp_path / "r.html", labels=["t", "t"])
    assert list(drawn["point_bars"][-1].bars) == ["t: mix (s), random data", "t: mix (s #2), random data"]


def test_seed_002_draws_its_latency_distribution(tmp_path, monkeypatch):
    test, options = preset_options("seed002-steady", 0.0001, {
        "engine": "null", "span": 16 * MIB, "duration_s": 3, "window_s": 2, "point_s": 0.05,
        "precondition_s": 0.05})
    results = run_bench(test, None, tmp_path / "s", options)
    dist = results["scores"]["latency_distribution"]
    assert sum(dist["counts"]) == pytest.approx(results["scores"]["steady_iops"] * 2)
    drawn = spy(monkeypatch, "latency_distribution", "scored_window")
    report.build_report([tmp_path / "s"], tmp_path / "r.html", labels=["t"])
    (ranges,) = drawn["latency_distribution"]
    assert ranges == {"t: steady": bench_charts.latency_ranges(dist)}
    page = (tmp_path / "r.html").read_text()
    assert "consistency warning" in page and "without stating its formula" in page


@pytest.mark.parametrize("test, options", [
    ("mix", {"duration_s": 0.01, "data": ("random", "compressible:50")}),
    ("seqmix", {"duration_s": 0.01}),
    ("act", {"duration_s": 1, "period_s": 1, "act_prep": False, "search": True, "start": 2,
             "step": 1}),
    ("steady", {"duration_s": 2, "window_s": 1, "round_s": 1, "point_s": 0.01, "qd_scaling": (1, 4),
                "read_shares": (1.0, 0.8, 0.6, 0.4, 0.2, 0.0), "read_share": 0.7, "op": (0, 25)}),
])
def test_every_number_a_test_scores_has_a_label_and_a_unit(tmp_path, test, options):
    results = run_bench(test, None, tmp_path / "s", BenchOptions(engine="null", span=16 * MIB, **options))
    scores = results["scores"]
    passes = [scores, *(v for k, v in scores.items() if k.startswith("op") and isinstance(v, dict))]
    keys = {k for s in passes for k in score_labels.numeric(s)}
    unlabelled = sorted(k for k in keys if not score_labels.label(k))
    assert keys and not unlabelled, unlabelled
    printed = format_results(results)
    assert "mb_per_s" not in printed and "iops_70" not in printed
