"""The seed presets of `replay bench`: each one issues exactly the parameters its review states
(sizes, shares, order, queue-depth split, data, fill over the whole target, scored window).
Every check reads the results files and results.json, and compares them with the review's
numbers written out here, not with the suite's own constants.
"""
import json
from pathlib import Path

import numpy as np
import pytest

from analysis import scoring
from analysis.summary import RunSummary
from analysis.verdict import SYNTHETIC_SCORES
from tests.cli_process import replay_cli
from replay.bench.options import BenchOptions
from replay.bench.presets import PRESETS, preset_options
from replay.bench.scores import steady_scores
from replay.bench.session import run_bench
from tests.replay.test_run_end_to_end import marks, on_loop, uring
from traces import schema
from traces.trace import open_trace

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
REPO = Path(__file__).resolve().parents[2]
SEEDS = Path("/work/shared/seeds")
# The reviews' own numbers, from the seed pages.
SIX = [1.0, 0.8, 0.6, 0.4, 0.2, 0.0]  # seed 001 and 002: "100% reads and adding 20% of writes"


def bench(*args, timeout=600):
    return replay_cli("bench", *args, cwd=REPO, timeout=timeout)


def columns(path, names=("op", "offset", "length", "intended_ns", "issue_ns")):
    chunks = list(open_trace(path).chunks(columns=list(names)))
    return {n: np.concatenate([c[n] for c in chunks]) for n in names}


def run_md(out, run):
    return open_trace(out / run["file"]).metadata


def measured(results, role="measure"):
    return [r for r in results["runs"] if r["role"] == role]


def assert_fill_covers(path, size):
    """128 KiB sequential writes from offset 0 to the end of the target, each byte once."""
    c = columns(path)
    order = np.argsort(c["offset"], kind="stable")
    offset, length = c["offset"][order], c["length"][order]
    assert (c["op"] == schema.Op.WRITE).all()
    assert (length[:-1] == 128 * KIB).all() and 0 < length[-1] <= 128 * KIB
    assert offset[0] == 0 and (offset[1:] == offset[:-1] + length[:-1]).all()
    assert offset[-1] + length[-1] == size


def read_share(path):
    c = columns(path, ("op",))
    return float((c["op"] == schema.Op.READ).mean())


def load(out):
    results = json.loads((out / "results.json").read_text())
    assert results["interrupted"] is False
    return results


# ---- names, help, list, docs ----------------------------------------------------------------


def test_every_preset_names_its_seed_in_help_list_and_docs():
    assert set(PRESETS) == {"seed000-mix", "seed000-act", "seed001-mix", "seed001-seqmix",
                            "seed002-steady", "seed003-steady", "seed004-iometer"}
    seeds = {p.name.split("-")[0][4:] for p in PRESETS.values()}
    assert seeds == {f.name[:3] for f in SEEDS.glob("*.txt")} if SEEDS.is_dir() else seeds
    help_text = bench("--help").stdout
    listed = bench("--list")
    assert listed.returncode == 0, listed.stderr
    page = (REPO / "docs" / "standard-tests.md").read_text()
    table = page[page.index("| Seed | Review test |"):]
    for name, p in PRESETS.items():
        assert name in " ".join(help_text.split()), name
        assert (SEEDS / f"{p.seed}.txt").is_file() or not SEEDS.is_dir(), p.seed
        block = listed.stdout[listed.stdout.index(f"{name}: seed {p.seed}"):]
        assert "span " in block.splitlines()[2], block
        assert f"replay bench {name}" in table and f"| {p.seed[:3]} " in table, name


def test_every_standard_test_has_one_procedure_in_the_order_the_cli_lists_them():
    from replay.bench import TESTS, procedures

    assert tuple(procedures.PROCEDURES) == TESTS


def test_a_preset_with_an_option_records_it_as_an_override(tmp_path):
    test, o = preset_options("seed001-mix", 0.5, {"span": 16 * MIB})
    assert test == "mix" and o.span == 16 * MIB and o.duration_s == 90
    done = bench("seed003-steady", "--engine", "null", "--span", "16M", "--scale", "0.0006",
                 "-o", tmp_path / "s")
    assert done.returncode == 0, done.stderr
    results = load(tmp_path / "s")
    assert results["preset"]["name"] == "seed003-steady"
    assert results["preset"]["overrides"] == ["span"]


@pytest.mark.parametrize("args,message", [
    (["seed009-mix"], "unknown test 'seed009-mix'"),
    (["mix", "--qd", "0x3"], "'0x3' is not a queue-depth split"),
    (["mix", "--data", "lumpy"], "--data 'lumpy' is not a data pattern"),
    (["steady", "--qd-scaling", "1,x"], "--qd-scaling takes whole numbers"),
    (["mix", "--read-shares", "70,120"], "'120' is not a read share"),
    (["act", "--act-latency", "device"], "--act-latency must be intended"),
    (["steady", "--op", "95"], "--op takes a whole percent of the target to leave unused, from 0 to 90"),
    (["seed003-steady", "--op", "-5"], "--op takes a whole percent"),
    (["steady", "--op", "12.5"], "--op takes a whole percent"),
])
def test_bad_preset_and_option_input_is_one_line(tmp_path, args, message):
    done = bench(*args, "--engine", "null", "--span", "16M", "-o", tmp_path / "out")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: ") and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "results.json").exists()


# ---- seed 001: QD3 over a 16 GiB span of a full drive; 128 KiB sequential at QD1 -------------


def test_seed001_mix_on_the_null_engine_is_qd3_over_16_gib(tmp_path):
    out = tmp_path / "m"
    done = bench("seed001-mix", "--engine", "null", "--scale", "0.0003", "-o", out)
    assert done.returncode == 0, done.stderr
    results = load(out)
    assert results["preset"] == {"name": "seed001-mix", "seed": PRESETS["seed001-mix"].seed,
                                 "review": PRESETS["seed001-mix"].review, "overrides": []}
    fill, *rest = results["runs"]
    assert fill["role"] == "precondition" and [r["role"] for r in rest] == ["measure"] * 6
    assert_fill_covers(out / fill["file"], results["target"]["size"])
    assert results["span"] == 16 * GIB
    for run, share in zip(rest, SIX):
        md = run_md(out, run)
        assert (md["run"]["qd"], md["run"]["workers"], md["run"]["mode"]) == (3, 1, "afap")
        assert md["run"]["time_limit_s"] == pytest.approx(180 * 0.0003)
        c = columns(out / run["file"])
        assert (c["length"] == 4 * KIB).all() and (c["offset"] % (4 * KIB) == 0).all()
        assert c["offset"].max() + 4 * KIB <= 16 * GIB and c["offset"].max() > 12 * GIB
        assert read_share(out / run["file"]) == pytest.approx(share, abs=0.02)
    s = results["scores"]
    mbps = [run["summary"]["mb_per_s"] for run in rest]
    assert s["mb_per_s_average_1x3"] == pytest.approx(sum(mbps) / 6)
    assert not any(k.startswith("iops_70_30") for k in s)  # seed 001 ran no 70/30 point
    assert not any(k.startswith("mb_per_s_r") for k in s)  # a sweep, not single points


@marks(uring, on_loop)
def test_seed001_mix_fills_the_whole_loop_device_and_tests_only_the_span(loop_device, tmp_path):
    device = loop_device(64 * MIB)
    out = tmp_path / "m"
    test, options = preset_options("seed001-mix", 0.0003, {"span": 16 * MIB})
    results = run_bench(test, device, out, options)
    fill = results["runs"][0]
    assert_fill_covers(out / fill["file"], 64 * MIB)  # the whole target, not the span
    for run in measured(results):
        c = columns(out / run["file"])
        assert c["offset"].max() + 4 * KIB <= 16 * MIB
        assert run_md(out, run)["run"]["qd"] == 3


@marks(uring, on_loop)
def test_seed001_seqmix_on_a_loop_device(loop_device, tmp_path):
    device = loop_device(32 * MIB)
    out = tmp_path / "q"
    test, options = preset_options("seed001-seqmix", 0.0005)
    results = run_bench(test, device, out, options)
    assert_fill_covers(out / results["runs"][0]["file"], 32 * MIB)
    runs = measured(results)
    assert len(runs) == 6
    for run, share in zip(runs, SIX):
        md = run_md(out, run)
        assert (md["run"]["qd"], md["run"]["workers"]) == (1, 1)
        c = columns(out / run["file"])
        assert (c["length"] == 128 * KIB).all()
        if len(c["offset"]) > 1:  # sequential: each I/O starts where the last one ended
            assert (np.diff(c["offset"]) % (32 * MIB) == 128 * KIB).mean() > 0.99
        assert md["trace"]["metadata"]["parameters"]["read_share"] == share
    assert "mb_per_s_average_1x1" in results["scores"]


# ---- seed 000: 32 workers x QD1 over a full drive; ACT --------------------------------------


@marks(uring, on_loop)
def test_seed000_mix_is_32_workers_at_qd1_and_the_verdict_reads_it(loop_device, tmp_path):
    device = loop_device(32 * MIB)
    out = tmp_path / "m"
    test, options = preset_options("seed000-mix", 0.0003)
    results = run_bench(test, device, out, options)
    assert_fill_covers(out / results["runs"][0]["file"], 32 * MIB)
    runs = measured(results)
    assert [run_md(out, r)["trace"]["metadata"]["parameters"]["read_share"] for r in runs] == \
        SIX + [0.7]
    for run in runs:
        md = run_md(out, run)
        assert (md["run"]["workers"], md["run"]["qd"]) == (32, 1)
    iops = RunSummary()
    for chunk in open_trace(out / runs[-1]["file"]).chunks(
            columns=["op", "length", "intended_ns", "issue_ns", "complete_ns", "result"]):
        iops.add(chunk)
    key = SYNTHETIC_SCORES["mix"][0]
    assert key == "iops_70_30_32x1" and "32 workers x QD1" in SYNTHETIC_SCORES["mix"][1]
    assert results["scores"][key] == pytest.approx(iops.iops(), rel=1e-12)
    assert "iops_70_30_1x32" not in results["scores"]


@marks(uring, on_loop)
def test_mix_runs_one_split_at_a_time_refilling_before_each(loop_device, tmp_path):
    device = loop_device(16 * MIB)
    out = tmp_path / "m"
    results = run_bench("mix", device, out, BenchOptions(
        span=8 * MIB, duration_s=0.05, qd_splits=((1, 32), (32, 1)), read_shares=(0.7, 0.0)))
    names = [r["name"] for r in results["runs"]]
    assert names == ["fill1-1x32", "1x32-r70", "1x32-r0", "fill2-32x1", "32x1-r70", "32x1-r0"]
    for run in results["runs"]:
        if run["role"] == "precondition":
            assert_fill_covers(out / run["file"], 16 * MIB)
    s = results["scores"]
    assert s["iops_70_30_1x32"] == results["runs"][1]["summary"]["iops"]
    assert s["iops_70_30_32x1"] == results["runs"][4]["summary"]["iops"]


@marks(uring, on_loop)
def test_seed000_act_prepares_then_paces_evenly(loop_device, tmp_path):
    device = loop_device(64 * MIB)
    out = tmp_path / "a"
    test, options = preset_options("seed000-act", 2 / 3600, {"start": 2, "step": 1,
                                                             "span": 32 * MIB})
    results = run_bench(test, device, out, options)
    prep = [r for r in results["runs"] if r["role"] == "precondition"]
    assert [(r["name"], run_md(out, r)["run"]["data"]) for r in prep] == [
        ("act-prep-zeros", "zeros"), ("act-prep-random", "random")]
    for r in prep:  # act_prep covers the whole device, not just the span tested
        assert_fill_covers(out / r["file"], 64 * MIB)
    assert results["runs"][0]["role"] == "precondition"  # before the first try
    s = results["scores"]
    assert s["tried"][0]["multiple"] == 2 and "due" in s["latency_definition"]
    for run in measured(results):
        multiple = run["parameters"]["multiple"]
        c = columns(out / run["file"])
        small = (c["length"] <= 64 * KIB) & (c["op"] == schema.Op.READ)
        assert (c["length"][small] == 1536).all()  # 1.5 KiB records on a 512-byte device
        gaps = np.diff(np.sort(c["intended_ns"][small]))
        assert gaps.min() >= 1e9 / (2000 * multiple) - 2 and gaps.max() <= 1e9 / (2000 * multiple) + 2
        assert (c["offset"] + c["length"]).max() <= 32 * MIB
        writes = c["op"] == schema.Op.WRITE
        assert (c["length"][writes] == 128 * KIB).all()
        assert writes.sum() == pytest.approx(1000 * multiple * 1536 / (128 * KIB) * 2 * 2, abs=2)
    for period in s["periods"]:
        lateness = period["lateness"]["limits"]
        assert [r["over_ns"] for r in lateness] == [1_000_000, 8_000_000, 64_000_000]


# ---- seed 002 and 003: steady state -----------------------------------------------------------


@marks(uring, on_loop)
def test_seed002_steady_70_30_then_qd_scaling_then_the_six_mixes(loop_device, tmp_path):
    device = loop_device(32 * MIB)
    out = tmp_path / "s"
    scale = 3 / 21600  # the 6 h run in 3 s
    test, options = preset_options("seed002-steady", scale)
    results = run_bench(test, device, out, options)
    names = [r["name"] for r in results["runs"]]
    assert names == ["fill", "precondition", "steady", "qd1-r70", "qd2-r70", "qd4-r70", "qd8-r70",
                     "qd16-r70", "qd32-r70", "1x32-r100", "1x32-r80", "1x32-r60", "1x32-r40",
                     "1x32-r20", "1x32-r0"]
    assert_fill_covers(out / results["runs"][0]["file"], 32 * MIB)
    pre = results["runs"][1]
    c = columns(out / pre["file"])
    assert (c["op"] == schema.Op.WRITE).all() and (c["length"] == 128 * KIB).all()
    fill_s = results["runs"][0]["summary"]["duration_ns"] / 1e9
    assert pre["parameters"]["time_limit_s"] == pytest.approx(7200 * scale - fill_s)
    steady = results["runs"][2]
    md = run_md(out, steady)
    assert md["run"]["qd"] == 32 and md["run"]["time_limit_s"] == 3
    assert read_share(out / steady["file"]) == pytest.approx(0.7, abs=0.02)
    assert (columns(out / steady["file"])["length"] == 4 * KIB).all()
    s = results["scores"]
    bins = scoring.Bins.from_chunks(open_trace(out / steady["file"]).chunks(
        columns=["op", "length", "intended_ns", "issue_ns", "complete_ns", "result"]),
        scoring.SECOND_NS, (10_000_000,))
    again = steady_scores(bins, 1, 1, None, 3 * scoring.SECOND_NS)  # 500 s and 60 s, scaled
    assert s["window_s"] == 1 and s["slow_ns"] == 10_000_000
    assert s["steady_iops"] == again["steady_iops"] and s["slow_share"] == again["slow_share"]
    assert [r["qd"] for r in s["qd_scaling"]] == [1, 2, 4, 8, 16, 32]
    for run, qd in zip(results["runs"][3:9], [1, 2, 4, 8, 16, 32]):
        assert run_md(out, run)["run"]["qd"] == qd
        assert run["parameters"]["read_share"] == 0.7
    for run, share in zip(results["runs"][9:], SIX):
        assert run_md(out, run)["run"]["qd"] == 32 and run["parameters"]["read_share"] == share


@marks(uring, on_loop)
def test_seed003_steady_is_an_hour_of_random_writes_scored_on_400_s(loop_device, tmp_path):
    device = loop_device(32 * MIB)
    out = tmp_path / "s"
    scale = 3 / 3600
    results = run_bench(*preset_options("seed003-steady", scale)[:1], device, out,
                        preset_options("seed003-steady", scale)[1])
    # The default capacity, then the review's second run at 25 % over-provisioning.
    assert [r["name"] for r in results["runs"]] == ["fill", "steady", "op25-discard",
                                                    "op25-fill", "op25-steady"]
    assert_fill_covers(out / "fill.parquet", 32 * MIB)
    assert_fill_covers(out / "op25-fill.parquet", 24 * MIB)
    for run in ("steady", "op25-steady"):
        assert read_share(out / f"{run}.parquet") == 0.0
    c = columns(out / "op25-steady.parquet")
    assert (c["offset"] + c["length"]).max() <= 24 * MIB
    assert results["runs"][1]["parameters"]["time_limit_s"] == 3
    assert results["runs"][4]["parameters"]["time_limit_s"] == 3
    assert results["scores"]["window_s"] == 1  # 400 s scaled, in whole seconds
    assert results["scores"]["op25"]["window_s"] == 1 and results["scores"]["op25"]["steady_iops"] > 0
    assert [p["op"] for p in results["op"]] == [0, 25]


def test_steady_checks_steady_state_over_every_round():
    # 30 noisy rounds, then 30 flat ones: steady at round 35, past PTS's 25-round limit.
    per_second = np.concatenate([np.tile([1, 3], 15), np.full(30, 10)])
    n = len(per_second)
    t = np.repeat(np.arange(n, dtype=np.int64) * scoring.SECOND_NS, per_second) + 1000
    bins = scoring.consistency_bins()
    bins.add({"op": np.full(len(t), schema.Op.WRITE, np.uint8), "length": np.full(len(t), 4096),
              "intended_ns": t, "issue_ns": t, "complete_ns": t + 1, "result": np.full(len(t), 4096)})
    s = steady_scores(bins, 10, 1, None, n * scoring.SECOND_NS)
    assert len(s["round_iops"]) == 60
    assert s["steady_state"]["reached"] and s["steady_state"]["round"] == 35
    assert s["last_rounds_steady"]


# ---- seed 004: Iometer 4 KiB random, two data patterns, 8 GiB span --------------------------


@marks(uring, on_loop)
def test_seed004_iometer_order_data_and_8_gib_span(loop_device, tmp_path):
    device = loop_device(8 * GIB + 64 * MIB)  # sparse: only what is written takes space
    out = tmp_path / "i"
    test, options = preset_options("seed004-iometer", 0.0003)
    results = run_bench(test, device, out, options)
    runs = results["runs"]
    assert all(r["role"] == "measure" for r in runs)  # the seed states no fill
    got = [(run_md(out, r)["run"]["qd"], run_md(out, r)["run"]["workers"],
            run_md(out, r)["run"]["data"], r["parameters"]["read_share"]) for r in runs]
    assert got == [(3, 1, "random", 0.0), (3, 1, "compressible:50", 0.0),
                   (32, 1, "random", 0.0), (32, 1, "compressible:50", 0.0), (3, 1, "random", 1.0)]
    top = 0
    for r in runs:
        c = columns(out / r["file"])
        assert (c["length"] == 4 * KIB).all() and c["offset"].max() + 4 * KIB <= 8 * GIB
        top = max(top, int(c["offset"].max()))
        assert r["parameters"]["time_limit_s"] == pytest.approx(180 * 0.0003)
    assert top > 4 * GIB  # the whole 8 GiB span, not the 64 MiB beyond it
    s = results["scores"]
    for r, key in zip(runs, ["r0_1x3", "r0_1x3_compressible50", "r0_1x32",
                             "r0_1x32_compressible50", "r100_1x3"]):
        assert s[f"mb_per_s_{key}"] == r["summary"]["mb_per_s"]  # the review's average MB/s


# ---- the reviews' pictures ---------------------------------------------------------------------


def test_the_report_draws_the_reviews_pictures_of_bench_sets(tmp_path, monkeypatch):
    from analysis import bench_charts, plots, report

    steady = tmp_path / "steady"
    run_bench("steady", None, steady, BenchOptions(
        engine="null", span=16 * MIB, duration_s=6, window_s=3, round_s=1, point_s=0.05,
        read_share=0.7, qd_scaling=(1, 4, 32), read_shares=tuple(SIX)))
    seq = tmp_path / "seq"
    run_bench("seqmix", None, seq, BenchOptions(engine="null", span=16 * MIB, duration_s=0.05,
                                                read_shares=tuple(SIX)))
    drawn = {}
    original = plots.steady_rounds

    def spy(rounds, *args, **kwargs):
        drawn.update(rounds)
        return original(rounds, *args, **kwargs)

    monkeypatch.setattr(plots, "steady_rounds", spy)
    html = report.build_report([steady, seq], tmp_path / "r.html", labels=["t", "t"])
    files = {p.stem for p in (tmp_path / "r_files").iterdir()}
    assert {"mix_sweep_mb", "seqmix_sweep", "steady_window", "qd_scaling", "steady_rounds"} <= files
    assert html.is_file()
    # The rounds chart shows each round's own average, not the rolling 5-round window's.
    scores = load(steady)["scores"]
    (values,) = drawn.values()
    assert list(values) == scores["round_iops"] and len(values) == 6
    assert scores["steady_state"]["rounds"][-1]["average"] != values[-1] or \
        np.mean(values[-5:]) == values[-1]
    chart = bench_charts.sweep_chart({"t": scores["table"]})
    mbps = [r["mb_per_s"] for r in scores["table"]]
    assert chart.average == {"t QD32": pytest.approx(sum(mbps) / 6)} and chart.unit == "MB/s"


def test_a_discard_is_a_pts_purge_on_a_file_but_not_on_a_drive():
    from traces.targets import Target
    from replay.bench.procedures import purge_statement

    drive = Target("/dev/nvme0n1", "block", 1 << 40, 512, 4096)
    loop = Target("/dev/loop3", "block", 1 << 30, 512, 512, backing_file="/var/tmp/x.img")
    file = Target("/var/tmp/x.img", "file", 1 << 30, 512, 4096)
    said = purge_statement(drive)
    assert said["pts_purge"] is False and "nvme format" in said["why"]
    assert purge_statement(loop)["pts_purge"] is True and purge_statement(file)["pts_purge"] is True


# ---- --duration alone on a steady test ------------------------------------------------------


def test_duration_alone_scales_steadys_rounds_and_window():
    from replay.bench.presets import duration_follows

    # seed 002: 60 s rounds and a 500 s window in a 6 h run; at 2,160 s (a tenth) 6 s and 50 s.
    assert duration_follows("seed002-steady", {"duration_s": 2160.0}) == {
        "duration_s": 2160.0, "round_s": 6.0, "window_s": 50.0}
    # Given with it, a round or window is the user's; other tests' durations change nothing else.
    assert duration_follows("seed002-steady", {"duration_s": 2160.0, "round_s": 60.0}) == {
        "duration_s": 2160.0, "round_s": 60.0, "window_s": 50.0}
    assert duration_follows("seed000-mix", {"duration_s": 1.0}) == {"duration_s": 1.0}


def test_seed_002_at_duration_6_checks_six_rounds_not_too_few(tmp_path):
    # The review's 6 h at --duration 6: 60 * 6 / 21,600 and 500 * 6 / 21,600 s are under a
    # second, so 1 s rounds and a 1 s window; 6 rounds, enough for the 5-round check.
    r = bench("seed002-steady", "--engine", "null", "--span", "16M", "--duration", "6",
              "--precondition", "0.05", "--point", "0.01", "--qd-scaling", "1",
              "-o", tmp_path / "s")
    assert r.returncode == 0, r.stderr
    results = json.loads((tmp_path / "s" / "results.json").read_text())
    s = results["scores"]
    assert s["round_s"] == 1 and s["window_s"] == 1 and len(s["round_iops"]) == 6
    assert s["steady_state"]["status"] != "too few rounds"
    assert {"duration_s", "round_s", "window_s"} <= set(results["preset"]["overrides"])
    assert "(checked over 6 rounds of 1 s;" in r.stdout


def test_steady_without_a_preset_scales_its_rounds_with_duration(tmp_path):
    # The test's own 60 s rounds and 400 s window in an hour: at 6 s, 0.1 s and 0.67 s, so 1 s.
    results = run_bench("steady", None, tmp_path / "s", BenchOptions(
        engine="null", span=16 * MIB, duration_s=6, fill=False))
    s = results["scores"]
    assert s["round_s"] == 1 and s["window_s"] == 1 and len(s["round_iops"]) == 6
