"""ACT as ACT runs: at most ACT's transaction threads' worth of I/Os outstanding (checked on a
real loop device from the results' issue and completion times), --multiple as where the search
starts, and seed 000's chart (the passing multiple, per hour the share over 1, 8 and 64 ms)
checked against shares computed by hand from a small results set.
"""
import json
from pathlib import Path

import numpy as np
import pytest

from analysis import act_chart
from analysis.report import build_report
from replay.bench.options import BenchOptions
from replay.bench.presets import PRESETS, describe_preset, preset_options
from replay.bench.session import run_bench
from tests.cli_process import replay_cli
from tests.replay.test_run_end_to_end import marks, on_loop, uring
from traces import schema
from traces.trace import open_trace

KIB, MIB = 1 << 10, 1 << 20
REPO = Path(__file__).resolve().parents[2]
COLUMNS = ["op", "length", "intended_ns", "issue_ns", "complete_ns", "result"]


def bench(*args, timeout=300):
    return replay_cli("bench", *args, cwd=REPO, timeout=timeout)


def columns(path):
    chunks = list(open_trace(path).chunks(columns=COLUMNS))
    return {n: np.concatenate([c[n] for c in chunks]) for n in COLUMNS}


def max_outstanding(c) -> int:
    """The most I/Os between issue and completion at once: +1 at each issue, -1 at each
    completion, a completion first where the two times are equal (its slot is free again)."""
    issued = c["issue_ns"] >= 0
    times = np.concatenate([c["complete_ns"][issued], c["issue_ns"][issued]])
    steps = np.concatenate([-np.ones(issued.sum(), np.int64), np.ones(issued.sum(), np.int64)])
    order = np.lexsort((steps, times))  # by time, then -1 before +1
    return int(np.cumsum(steps[order]).max())


# ---- ACT's concurrency -------------------------------------------------------------------------


def test_the_preset_runs_with_acts_64_threads_and_says_where_they_come_from():
    test, o = preset_options("seed000-act")
    assert test == "act" and o.act_threads == 64 == 8 * 8 and BenchOptions().act_threads == 64
    listed = "\n".join(describe_preset(PRESETS["seed000-act"]))
    assert "at most 64 I/Os outstanding" in listed and "8 queues x 8 threads per queue" in listed
    assert "a total of 64 threads" in listed  # the page's own words
    page = (Path("/work/shared/seeds") / "000_e00a9c71e8fcdb9d.txt")
    if page.exists():
        assert "a total of 64 threads" in page.read_text()


@marks(uring, on_loop)
def test_never_more_than_act_threads_outstanding_on_a_loop_device(loop_device, tmp_path):
    """50x (100,000 reads a second) swamps a drive of 20,000 IOPS: transactions queue for the
    6 slots, their wait is in their latency, and no more than 6 are ever in flight. (A plain
    loop device over a sparse file can keep up with 50x on a quiet host, so the drive is a
    loop device stacked on a throttled one, as bench/causal.py's slow drive.)"""
    from bench.targets import root_throttle, stacked_loop

    out, lower = tmp_path / "act", loop_device(64 * MIB)
    with root_throttle(lower, 20_000, 20_000, 1 << 30), stacked_loop(lower) as device:
        results = run_bench("act", device, out, BenchOptions(
            multiple=50, duration_s=1, period_s=1, act_prep=False, act_threads=6, span=32 * MIB))
    run = [r for r in results["runs"] if r["role"] == "measure"][0]
    assert run["parameters"]["max_inflight"] == 6 and results["scores"]["act_threads"] == 6
    assert open_trace(out / run["file"]).metadata["run"]["max_inflight"] == 6
    c = columns(out / run["file"])
    assert (c["issue_ns"] >= 0).sum() > 1000
    assert max_outstanding(c) == 6  # reached, never passed
    small = (c["op"] == schema.Op.READ) & (c["length"] <= 64 * KIB) & (c["issue_ns"] >= 0)
    waited = c["issue_ns"][small] - c["intended_ns"][small]
    # Overloaded, transactions waited for a slot, and ACT's latency (from due) counts the wait.
    assert np.median(waited) > 1_000_000
    assert results["scores"]["latency_definition"].startswith("queue-era ACT")
    assert results["scores"]["passed"] is False


@marks(uring, on_loop)
def test_the_default_limit_is_64_on_a_loop_device(loop_device, tmp_path):
    device = loop_device(64 * MIB)
    out = tmp_path / "act"
    results = run_bench("act", device, out, BenchOptions(
        multiple=50, duration_s=1, period_s=1, act_prep=False, span=32 * MIB))
    run = [r for r in results["runs"] if r["role"] == "measure"][0]
    assert run["parameters"]["max_inflight"] == 64
    assert max_outstanding(columns(out / run["file"])) <= 64


# ---- --multiple starts the search ----------------------------------------------------------------


def test_multiple_is_where_the_preset_search_starts(tmp_path):
    out = tmp_path / "s"
    done = bench("seed000-act", "--engine", "null", "--span", "64M", "--multiple", "3",
                 "--step", "1", "--duration", "1", "--period", "1", "--no-prep", "--json", "-o", out)
    assert done.returncode == 0, done.stderr
    results = json.loads((out / "results.json").read_text())
    s = results["scores"]
    assert s["tried"][0]["multiple"] == 3 and s["search_start"] == 3
    assert s["search_start_from"] == "multiple" and "multiple" in results["preset"]["overrides"]
    assert [r["name"] for r in results["runs"]][0] == "act-x3"
    words = act_chart.start_words(s)
    assert words.startswith("the search started at 3x (--multiple); there the replayer's own lateness")
    table = bench("seed000-act", "--engine", "null", "--span", "64M", "--multiple", "2",
                  "--step", "1", "--duration", "1", "--period", "1", "--no-prep", "-o", tmp_path / "t")
    assert "the search started at 2x (--multiple)" in table.stdout


def test_without_multiple_the_search_starts_at_the_reviews_150x():
    _, o = preset_options("seed000-act", 1.0, {})
    assert o.multiple is None and o.start == 150 and o.search
    assert act_chart.start_words({"search_start": 150, "search_start_from": "start", "periods": []}) \
        .startswith("the search started at 150x (the review's start, \"at least 150x\")")


@pytest.mark.parametrize("args, message", [
    (["act", "--search", "--multiple", "2.5"], "--search steps by whole multiples"),
    (["act", "--act-threads", "0"], "--act-threads must be from 1 to 32768"),
])
def test_bad_act_options_are_one_sentence(tmp_path, args, message):
    done = bench(*args, "--engine", "null", "-o", tmp_path / "x")
    assert done.returncode == 2 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


# ---- the chart ---------------------------------------------------------------------------------


def hand_shares(path, period_s):
    """Per whole period: the share (%) of small reads (<= 64 KiB) whose completion came more
    than 1, 8 and 64 ms after they were due, counted row by row."""
    c = columns(path)
    rows = [i for i in range(len(c["op"])) if c["op"][i] == schema.Op.READ
            and c["length"][i] <= 64 * KIB and c["issue_ns"][i] >= 0 and c["result"][i] >= 0]
    t0 = 0
    out = {}
    for i in rows:
        p = (int(c["intended_ns"][i]) - t0) // (period_s * 10**9)
        latency = int(c["complete_ns"][i]) - int(c["intended_ns"][i])
        n, over = out.get(p, (0, [0, 0, 0]))
        out[p] = (n + 1, [o + (latency > ms * 10**6) for o, ms in zip(over, (1, 8, 64))])
    return [[100.0 * o / n for o in over] for _, (n, over) in sorted(out.items())]


def test_chart_data_match_the_results_counted_by_hand(tmp_path):
    """Two "hours" of 1 s at 1x on the null engine: the chart's per-hour shares are the
    results' own, counted row by row; its score is the set's passing multiple."""
    out = tmp_path / "a"
    results = run_bench("act", None, out, BenchOptions(engine="null", span=64 * MIB, multiple=1,
                                                       duration_s=2, period_s=1))
    s = results["scores"]
    data = act_chart.chart_data({"null": s})
    assert data["score"] == {"null": 1 if s["passed"] else 0}
    h = data["hours"]["null"]
    assert h["multiple"] == 1 and h["passed"] == s["passed"]
    expected = hand_shares(out / "act-x1.parquet", 1)
    assert len(expected) == len(h["shares"]) == 2
    np.testing.assert_allclose(np.array(h["shares"], dtype=float), expected, rtol=0, atol=1e-9)


def test_chart_takes_the_run_at_the_score_and_skips_partial_hours():
    period = lambda shares, partial=False: {"shares": shares, "partial": partial}  # noqa: E731
    scores = {"act_multiple": 20, "passed": True, "search_start": 30, "search_start_from": "start",
              "periods": [
                  {"multiple": 30, "passed": False, "periods": [period([0.5, 0.2, 0.01])],
                   "lateness": {"limits": [{"over_ns": 1_000_000, "share": 0.001},
                                           {"over_ns": 8_000_000, "share": 0.0},
                                           {"over_ns": 64_000_000, "share": 0.0}]}},
                  {"multiple": 20, "passed": True, "periods": [
                      period([0.04, 0.005, 0.0]), period([0.01, None, 0.0]),
                      period([0.9, 0.9, 0.9], partial=True)]}]}
    data = act_chart.chart_data({"drive A": scores, "drive B": {**scores, "passed": False,
                                                                 "act_multiple": 0}})
    assert data["score"] == {"drive A": 20, "drive B": 0}
    assert data["hours"]["drive A"] == {"multiple": 20, "passed": True,
                                        "shares": [[4.0, 0.5, 0.0], [1.0, None, 0.0]]}
    assert data["hours"]["drive B"]["multiple"] == 20  # none passed: the last tried
    words = act_chart.start_words(scores)
    assert words == ("the search started at 30x (--start); there the replayer's own lateness (its "
                     "worst hour): 0.100% of transactions issued over 1 ms late, 0.000% of "
                     "transactions issued over 8 ms late, 0.000% of transactions issued over 64 ms "
                     "late (ACT allows 5.0%, 1.0%, 0.1%)")


def test_the_report_draws_the_act_chart(tmp_path):
    out = tmp_path / "a"
    run_bench("act", None, out, BenchOptions(engine="null", span=64 * MIB, search=True,
                                             multiple=2, step=1, duration_s=1, period_s=1))
    html = build_report([out], tmp_path / "r.html", labels=["null drive"]).read_text()
    assert "id='act'" in html and (tmp_path / "r_files" / "act.png").stat().st_size > 0
    assert "the search started at 2x (--multiple); there the replayer&#x27;s own lateness" in html
