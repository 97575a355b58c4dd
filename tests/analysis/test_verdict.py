"""`replay verdict`: synthetic ratios next to real-use ratios, end to end on the two-drive pair,
and every kind of bad input answered with one sentence and exit code 2."""
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests import cli_process
from analysis.verdict import _log_share, verdict
from replay.runner import RunOptions, replay
from synth.generators import random_mix, to_trace
from traces.schema import METADATA_KEY

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[2]


def replay_cli(*args):
    return cli_process.replay_cli(*args, cwd=REPO)


def _trace(path, *, rate=None, count=1000, name=None, read_share=0.7):
    to_trace(random_mix(block_size=4096, read_share=read_share, span=32 * MIB, span_start=0,
                        count=count, rate=rate, queue_depth=32, seed=5), path,
             metadata={"name": name} if name else None)
    return path


def _rewrite(src, dst, rows=None, **meta):
    """A copy of a results file, cut to `rows` rows, with metadata keys replaced."""
    table = pq.read_table(src)
    doc = json.loads(table.schema.metadata[METADATA_KEY])
    doc.update(meta)
    if rows is not None:
        table = table.slice(0, rows)
    pq.write_table(table.replace_schema_metadata({METADATA_KEY: json.dumps(doc).encode()}), dst)
    return dst


@pytest.fixture(scope="module")
def null_runs(tmp_path_factory):
    """Null-engine results: a closed-loop synthetic run and a timed workload per side, with
    side B made 'faster' by a deeper queue (which the null engine completes sooner)."""
    d = tmp_path_factory.mktemp("verdict")
    synth, work = _trace(d / "mix.parquet", count=4000), _trace(d / "w.parquet", rate=20000, count=2000, name="oltp")
    out = {}
    for side, qd in (("a", 1), ("b", 32)):
        (d / side).mkdir()
        replay(synth, None, RunOptions(engine="null", timing="afap", qd=qd), output=d / f"{side}-mix.parquet")
        replay(work, None, RunOptions(engine="null", timing="afap", qd=qd), output=d / side / "oltp.parquet")
        out[side] = (d / f"{side}-mix.parquet", d / side)
    out["dir"] = d
    return out


def _args(runs, **override):
    a = dict(sa=runs["a"][0], sb=runs["b"][0], ta=runs["a"][1], tb=runs["b"][1])
    a.update(override)
    return ["verdict", "--synthetic-a", a["sa"], "--synthetic-b", a["sb"], "--traces-a", a["ta"], "--traces-b", a["tb"]]


@pytest.mark.root
@pytest.mark.loopdev
def test_verdict_on_the_two_drive_pair(drive_pair, tmp_path):
    synth = _trace(tmp_path / "mix.parquet", count=3000)
    work = _trace(tmp_path / "work.parquet", rate=1000, count=1000, name="oltp", read_share=0.5)
    for side, dev in (("slow", drive_pair.slow), ("fast", drive_pair.fast)):
        (tmp_path / side).mkdir()
        for trace, out, extra in ((synth, tmp_path / f"{side}-mix.parquet", ["--afap", "--qd", "32"]),
                                  (work, tmp_path / side / "oltp.parquet", [])):
            done = drive_pair.replay(dev, "run", trace, dev, *extra, "--destroy-data", "-o", out)
            assert done.returncode == 0, done.stderr
    done = replay_cli("verdict", "--synthetic-a", tmp_path / "slow-mix.parquet", "--synthetic-b",
                      tmp_path / "fast-mix.parquet", "--traces-a", tmp_path / "slow", "--traces-b",
                      tmp_path / "fast", "--label-a", "slow", "--label-b", "fast", "--json")
    assert done.returncode == 0, done.stderr
    v = json.loads(done.stdout)
    assert (v["a"], v["b"]) == ("slow", "fast")
    (syn,) = v["synthetic"]
    assert syn["ratio"] > 1  # the unthrottled in-memory drive beats a 2,000 IOPS limit
    (w,) = v["workloads"]
    assert w["name"] == "oltp" and not w["closed_loop"] and w["primary"] == "wait"
    # Which drive made a timed workload wait longer is the measurement, not a given (a stall of
    # the shared machine can outweigh a light load's device time): check the bookkeeping.
    assert w["wait_ratio"] == pytest.approx(w["a"]["wait_ns"] / w["b"]["wait_ns"])
    assert w["p99_ratio"] == pytest.approx(w["a"]["p99_ns"] / w["b"]["p99_ns"])
    assert w["share"] == pytest.approx(math.log(w["wait_ratio"]) / math.log(syn["ratio"]))
    # Which answer is the measurement too (a stall can make the slow drive's run wait less:
    # "reversed"); test_every_threshold_gives_its_hand_computed_answer pins the answers.
    assert w["answer"] in ("yes", "partly", "no", "reversed")
    assert w["a"]["rows"] == w["b"]["rows"] == 1000
    assert "fast is" in w["sentence"] and "on oltp" in w["sentence"]
    table = replay_cli(*_args({"a": (tmp_path / "slow-mix.parquet", tmp_path / "slow"),
                               "b": (tmp_path / "fast-mix.parquet", tmp_path / "fast")}),
                       "--label-a", "slow", "--label-b", "fast")
    assert table.returncode == 0 and "real use" in table.stdout
    # The same sentence as the JSON's, labels included: a reversed answer names the faster
    # drive after its head too ("... more on fast"), so the whole sentence must match.
    assert w["sentence"] in table.stdout


def test_verdict_of_null_runs_reads_the_files(null_runs):
    v = verdict([null_runs["a"][0]], [null_runs["b"][0]], [null_runs["a"][1]], [null_runs["b"][1]])
    (w,) = v.workloads
    assert w.closed_loop and w.primary == "finish" and w.finish_ratio is not None
    assert w.a.rows == w.b.rows == 2000 and not (w.a.partial or w.b.partial)
    # Swapping the sides inverts every ratio and keeps the share.
    s = verdict([null_runs["b"][0]], [null_runs["a"][0]], [null_runs["b"][1]], [null_runs["a"][1]])
    assert s.synthetic[0].ratio == pytest.approx(1 / v.synthetic[0].ratio)
    assert s.workloads[0].finish_ratio == pytest.approx(1 / w.finish_ratio)
    assert s.workloads[0].share == pytest.approx(w.share)


def test_interrupted_run_is_compared_over_common_rows_and_marked(null_runs, tmp_path):
    (tmp_path / "a").mkdir()
    _rewrite(null_runs["a"][1] / "oltp.parquet", tmp_path / "a" / "oltp.parquet", rows=700, interrupted=True)
    done = replay_cli(*_args(null_runs, ta=tmp_path / "a"), "--json")
    assert done.returncode == 0, done.stderr
    (w,) = json.loads(done.stdout)["workloads"]
    assert w["a"]["partial"] and w["b"]["partial"] and w["a"]["rows"] == w["b"]["rows"] == 700
    assert w["finish_ratio"] is None and w["primary"] == "wait"
    assert "* partial" in replay_cli(*_args(null_runs, ta=tmp_path / "a")).stdout


def _bad(null_runs, tmp_path):
    d = null_runs["dir"]
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    _rewrite(null_runs["b"][1] / "oltp.parquet", tmp_path / "other" / "x.parquet", name="boot")
    (tmp_path / "diff").mkdir()
    _rewrite(null_runs["b"][1] / "oltp.parquet", tmp_path / "diff" / "x.parquet",
             trace={"path": "elsewhere", "rows": 5, "metadata": {}})
    (tmp_path / "timed").mkdir()
    _rewrite(null_runs["b"][1] / "oltp.parquet", tmp_path / "timed" / "x.parquet",
             run={"mode": "original", "speed": 1.0})
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "results.json").write_text("{}")
    return {
        "missing": (dict(ta=tmp_path / "nope"), "no such file"),
        "empty dir": (dict(tb=tmp_path / "empty"), "holds no .parquet"),
        "no common trace": (dict(tb=tmp_path / "other"), "no trace was replayed on both"),
        "different traces": (dict(tb=tmp_path / "diff"), "different traces"),
        "different modes": (dict(tb=tmp_path / "timed"), "replay both the same way"),
        "timed synthetic": (dict(sb=tmp_path / "timed" / "x.parquet"), "no synthetic score"),
        "set as traces": (dict(tb=tmp_path / "set"), "give it with --synthetic"),
        "trace not results": (dict(sa=d / "mix.parquet"), "not the results of a replay"),
    }


@pytest.mark.parametrize("case", ["missing", "empty dir", "no common trace", "different traces",
                                  "different modes", "timed synthetic", "set as traces", "trace not results"])
def test_bad_input_is_one_sentence_and_exit_2(null_runs, tmp_path, case):
    override, phrase = _bad(null_runs, tmp_path)[case]
    done = replay_cli(*_args(null_runs, **override))
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith("error: ") and phrase in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


ratios = st.floats(min_value=0.05, max_value=50).filter(lambda r: abs(math.log(r)) >= 0.01)


@given(real=st.floats(min_value=0.05, max_value=50), synthetic=ratios)
def test_share_is_symmetric_and_zero_at_no_difference(real, synthetic):
    share = _log_share(real, synthetic)
    assert share == pytest.approx(_log_share(1 / real, 1 / synthetic), abs=1e-9)
    assert _log_share(1.0, synthetic) == 0.0
    assert _log_share(synthetic, synthetic) == pytest.approx(1.0)
    assert (share > 0) == ((real > 1) == (synthetic > 1)) or real == 1.0


# ---- hand-made results with known answers ---------------------------------------------------
# Each workload is 1,000 I/Os, one due every millisecond (timed) or back to back at QD1 (afap),
# with a known lateness (issue - intended) and device time (complete - issue) per I/O. The
# workload waits late + device on each I/O, so every figure below is computed by hand.
MS = 1_000_000
ROWS = 1000
SYNTH_A, SYNTH_B = 1_000.0, 16_000.0  # 70/30 QD32 IOPS: B is 16x A; a real 4x is half of it


def _results(path, name, late_ns, device_ns, *, afap=False):
    late = np.broadcast_to(np.asarray(late_ns, dtype=np.int64), ROWS)
    device = np.broadcast_to(np.asarray(device_ns, dtype=np.int64), ROWS)
    if afap:  # QD1, as fast as possible: each I/O is issued when the previous one completes
        issue = np.concatenate([[0], np.cumsum(device)[:-1]]).astype(np.int64)
        intended, ts = issue.copy(), np.zeros(ROWS, dtype=np.int64)
    else:
        ts = np.arange(ROWS, dtype=np.int64) * MS
        intended = ts.copy()
        issue = intended + late
    columns = {"ts_ns": ts, "op": np.zeros(ROWS, dtype=np.uint8),
               "offset": np.arange(ROWS, dtype=np.int64) * 4096, "length": np.full(ROWS, 4096, dtype=np.int64),
               "intended_ns": intended, "issue_ns": issue, "complete_ns": issue + device,
               "result": np.full(ROWS, 4096, dtype=np.int64)}
    meta = {"schema_version": 1, "kind": "results", "name": name, "interrupted": False,
            "run": {"mode": "afap" if afap else "original", "speed": 1.0, "qd": 1},
            "trace": {"path": f"{name}.parquet", "rows": ROWS}, "target": {"path": str(path.parent)}}
    pq.write_table(pa.table(columns).replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()}), path)
    return path


def _score_set(path, iops, run_file):
    path.mkdir()
    shutil.copy(run_file, path / "r70-qd32.parquet")
    (path / "results.json").write_text(json.dumps({
        "format": "tracereplay-results-set", "version": 1, "test": "mix", "target": {"path": path.name},
        "interrupted": False, "options": {}, "scores": {"iops_70_30_32x1": iops},
        "runs": [{"name": "r70-qd32", "file": "r70-qd32.parquet", "role": "measure", "parameters": {}}]}))
    return path


# name: (A's lateness, A's device time, B's device time; B is never late), and what the verdict
# must say: the waiting-time ratio A / B, the share of the 16x synthetic advantage
# (log(real) / log(16)) and the answer. The lateness makes "waited" differ from device latency.
KNOWN = {
    "yes":        (5 * MS, 3 * MS, 1 * MS, 8.0, 0.75, "yes"),  # 8x of 16x: 3/4 on a log scale
    "above_half": (2_400_000, 2 * MS, 1 * MS, 4.4, 0.5344, "yes"),  # just above SHOWS_UP = 0.5
    "below_half": (1_600_000, 2 * MS, 1 * MS, 3.6, 0.4620, "partly"),  # just below it
    "above_10pc": (400_000, 1 * MS, 1 * MS, 1.4, 0.1214, "partly"),  # just above PARTLY = 0.1
    "below_10pc": (300_000, 1 * MS, 1 * MS, 1.3, 0.0946, "no"),  # just below it
    "noise":      (0, 960_000, 1 * MS, 0.96, -0.0147, "no"),  # within NOISE = 5 %: not reversed
    "reversed":   (0, 940_000, 1 * MS, 0.94, -0.0223, "reversed"),  # just beyond it
}


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    d = tmp_path_factory.mktemp("known")
    for side in "ab":
        (d / side).mkdir()
    for name, (late_a, dev_a, dev_b, *_) in KNOWN.items():
        _results(d / "a" / f"{name}.parquet", name, late_a, dev_a)
        _results(d / "b" / f"{name}.parquet", name, 0, dev_b)
    # A tail: 2 % of I/Os take 50 ms on A (2 ms late, 48 ms on the device) and 5 ms on B, the rest 1 ms on both. The p99 (the
    # 990th of 1,000) is in the tail; the waiting time is 980 + 20 x 50 = 1,980 ms on A and
    # 980 + 20 x 5 = 1,080 ms on B.
    slow = np.arange(ROWS) % 50 == 49
    _results(d / "a" / "tail.parquet", "tail", np.where(slow, 2 * MS, 0), np.where(slow, 48 * MS, MS))
    _results(d / "b" / "tail.parquet", "tail", 0, np.where(slow, 5 * MS, MS))
    # Closed loop at QD1: 1,000 I/Os of 10 ms on A finish in 10 s, of 1.25 ms on B in 1.25 s.
    _results(d / "a" / "boot.parquet", "boot", 0, 10 * MS, afap=True)
    _results(d / "b" / "boot.parquet", "boot", 0, 1_250_000, afap=True)
    sa = _score_set(d / "mix-a", SYNTH_A, d / "a" / "yes.parquet")
    sb = _score_set(d / "mix-b", SYNTH_B, d / "b" / "yes.parquet")
    same = _score_set(d / "mix-same", SYNTH_A, d / "b" / "yes.parquet")
    return {"dir": d, "sa": sa, "sb": sb, "same": same}


def test_every_threshold_gives_its_hand_computed_answer(known):
    d = known["dir"]
    v = verdict([known["sa"]], [known["sb"]], [d / "a"], [d / "b"], "slow", "fast")
    (s,) = v.synthetic
    assert (s.label, s.a, s.b, s.ratio) == ("70/30 QD32 (32 workers x QD1)", 1_000.0, 16_000.0, 16.0)
    got = {w.name: w for w in v.workloads}
    for name, (late_a, dev_a, dev_b, ratio, share, answer) in KNOWN.items():
        w = got[name]
        assert (w.a.rows, w.b.rows, w.primary) == (ROWS, ROWS, "wait"), name
        assert w.a.wait_ns == ROWS * (late_a + dev_a) and w.b.wait_ns == ROWS * dev_b, name
        assert w.wait_ratio == pytest.approx(ratio), name
        assert w.p99_ratio == pytest.approx(ratio, rel=1 / 128), name
        assert w.share == pytest.approx(share, abs=1e-4), name
        assert w.answer == answer, name
        assert w.finish_ratio is None, name
    assert "fast is 16.00x faster than slow on 70/30 QD32 (32 workers x QD1); on yes it waits on storage 8.00x less: " \
           "75% of the synthetic advantage." == got["yes"].sentence
    assert got["noise"].sentence.endswith("within 5% of the same time: the advantage does not show.")
    assert got["reversed"].sentence.endswith("waits on storage 1.06x more on fast: the advantage is reversed.")


def test_p99_and_time_to_finish_are_hand_computed(known):
    d = known["dir"]
    got = {w.name: w for w in verdict([known["sa"]], [known["sb"]], [d / "a"], [d / "b"]).workloads}
    tail = got["tail"]
    assert (tail.a.wait_ns, tail.b.wait_ns) == (1_980 * MS, 1_080 * MS)
    assert tail.a.p99_ns == pytest.approx(50 * MS, rel=1 / 256) and tail.b.p99_ns == pytest.approx(5 * MS, rel=1 / 256)
    assert tail.p99_ratio == pytest.approx(10.0, rel=1 / 128)
    assert tail.share == pytest.approx(math.log(1980 / 1080) / math.log(16)) and tail.answer == "partly"
    boot = got["boot"]
    assert boot.closed_loop and boot.primary == "finish"
    assert (boot.a.finish_ns, boot.b.finish_ns) == (10_000 * MS, 1_250 * MS)
    assert boot.finish_ratio == 8.0 and boot.share == pytest.approx(0.75) and boot.answer == "yes"
    assert boot.sentence.endswith("on boot it finishes 8.00x sooner: 75% of the synthetic advantage.")


def test_no_synthetic_difference_is_not_applicable(known):
    d = known["dir"]
    v = verdict([known["sa"]], [known["same"]], [d / "a"], [d / "b"])
    assert v.synthetic[0].ratio == 1.0
    for w in v.workloads:
        assert (w.share, w.answer) == (None, "n/a"), w.name
        assert w.sentence.endswith("the comparison is undefined (no synthetic difference).")


def test_cli_json_carries_the_hand_computed_figures(known):
    d = known["dir"]
    done = replay_cli("verdict", "--synthetic-a", known["sa"], "--synthetic-b", known["sb"],
                      "--traces-a", d / "a", "--traces-b", d / "b", "--json")
    assert done.returncode == 0, done.stderr
    got = {w["name"]: w for w in json.loads(done.stdout)["workloads"]}
    for name, (*_, ratio, share, answer) in KNOWN.items():
        assert (got[name]["answer"], round(got[name]["share"], 4), got[name]["wait_ratio"]) == \
            (answer, share, pytest.approx(ratio)), name
    assert got["boot"]["finish_ratio"] == 8.0 and got["boot"]["primary_ratio"] == 8.0


# -- the verdict speaks in application terms for causal replays ------------------------------

def _causal_results(path, name, device_ns, think_ns=MS, rows=1000, mode="causal"):
    """A hand-made results file of one closed chain: each I/O issued `think_ns` after the
    previous one completed, taking `device_ns`."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from traces.schema import METADATA_KEY

    issue = np.arange(rows, dtype=np.int64) * (device_ns + think_ns)
    columns = {"ts_ns": issue.copy(), "op": np.zeros(rows, np.uint8), "offset": np.arange(rows, dtype=np.int64) * 4096,
               "length": np.full(rows, 4096, np.int64), "intended_ns": issue, "issue_ns": issue,
               "complete_ns": issue + device_ns, "result": np.full(rows, 4096, np.int64)}
    meta = {"schema_version": 1, "kind": "results", "name": name, "interrupted": False,
            "run": {"mode": mode, "speed": 1.0, "qd": 1}, "trace": {"path": f"{name}.parquet", "rows": rows},
            "target": {"path": str(path.parent)}}
    pq.write_table(pa.table(columns).replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()}), path)
    return path


def test_the_verdict_gives_a_causal_replays_run_time_in_application_terms(tmp_path):
    from analysis.verdict import VerdictError, verdict

    for side in "ab":
        (tmp_path / side).mkdir()
    # 1,000 I/Os with 1 ms of the application's own time after each: 2 ms each on A, 0.5 ms on
    # B, so the application would run 1000 x 2 + 999 x 1 = 2,999 ms on A and 1,499 ms on B.
    _causal_results(tmp_path / "a" / "oltp.parquet", "oltp", 2 * MS)
    _causal_results(tmp_path / "b" / "oltp.parquet", "oltp", MS // 2)
    sa = _score_set(tmp_path / "mix-a", 1_000.0, tmp_path / "a" / "oltp.parquet")
    sb = _score_set(tmp_path / "mix-b", 16_000.0, tmp_path / "b" / "oltp.parquet")
    v = verdict([sa], [sb], [tmp_path / "a"], [tmp_path / "b"], "slow", "fast")
    (w,) = v.workloads
    assert (w.mode, w.primary) == ("causal", "finish")
    assert (w.a.finish_ns, w.b.finish_ns) == (2_999 * MS, 1_499 * MS)
    assert w.sentence == ("fast is 16.00x faster than slow on 70/30 QD32 (32 workers x QD1); oltp would "
                          f"finish 2.00x sooner on fast (causal replay): {w.share:.0%} of the synthetic advantage.")
    assert "  oltp          causal" in v.format_table()
    # One side causal, the other not: refused, saying how to replay.
    _causal_results(tmp_path / "b" / "oltp.parquet", "oltp", MS // 2, mode="original")
    with pytest.raises(VerdictError, match="causal timing on one target only"):
        verdict([sa], [sb], [tmp_path / "a"], [tmp_path / "b"])


def test_a_causal_replay_that_finishes_in_the_same_time_says_so_in_a_sentence(tmp_path):
    """An application paced by its own users (a rate, think time) runs as long on either
    drive; the sentence says so in words, and how much less its I/Os waited."""
    from analysis.verdict import verdict

    for side in "ab":
        (tmp_path / side).mkdir()
    # 1,000 I/Os, each 1 ms on A and 0.5 ms on B after 100 ms of the application's own time:
    # 100.999 s on A and 100.4995 s on B, 0.5 % apart; its I/Os wait 2x less on B.
    _causal_results(tmp_path / "a" / "blob.parquet", "blob", MS, think_ns=100 * MS)
    _causal_results(tmp_path / "b" / "blob.parquet", "blob", MS // 2, think_ns=100 * MS)
    sa = _score_set(tmp_path / "mix-a", 1_000.0, tmp_path / "a" / "blob.parquet")
    sb = _score_set(tmp_path / "mix-b", 16_000.0, tmp_path / "b" / "blob.parquet")
    (w,) = verdict([sa], [sb], [tmp_path / "a"], [tmp_path / "b"], "slow", "fast").workloads
    assert w.answer == "no"
    assert w.sentence == ("fast is 16.00x faster than slow on 70/30 QD32 (32 workers x QD1); blob would "
                          "finish within 5% of the same time on either (causal replay), though its I/Os "
                          "wait 2.00x less on fast: the advantage does not show in its run time.")
