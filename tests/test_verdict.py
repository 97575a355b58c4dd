"""`replay verdict`: synthetic ratios next to real-use ratios, end to end on the two-drive pair,
and every kind of bad input answered with one sentence and exit code 2."""
import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

import cli_process
from analysis.verdict import _log_share, verdict
from replay.runner import RunOptions, replay
from synth.generators import random_mix, to_trace
from traces.schema import METADATA_KEY

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[1]


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
        replay(synth, None, RunOptions(engine="null", afap=True, qd=qd), output=d / f"{side}-mix.parquet")
        replay(work, None, RunOptions(engine="null", afap=True, qd=qd), output=d / side / "oltp.parquet")
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
    assert w["answer"] in ("yes", "partly", "no")
    assert w["a"]["rows"] == w["b"]["rows"] == 1000
    assert "fast is" in w["sentence"] and "on oltp" in w["sentence"]
    table = replay_cli(*_args({"a": (tmp_path / "slow-mix.parquet", tmp_path / "slow"),
                               "b": (tmp_path / "fast-mix.parquet", tmp_path / "fast")}))
    assert table.returncode == 0 and "real use" in table.stdout
    assert w["sentence"].split("; ", 1)[1] in table.stdout  # the same sentence, default labels


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
