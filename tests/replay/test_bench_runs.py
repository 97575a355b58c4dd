"""`replay bench` and the runner on generators: generators replayed row for row, time limits
that end a run without interrupting it, each standard test at a tiny scale on a real loop
device with its scores recomputed from the Parquet files, and bad input as one sentence.
"""
import glob
import json
import math
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli_process import replay_cli, replay_process, wait_for
from analysis import scoring
from analysis.summary import RunSummary
from replay.bench.options import UNBOUNDED, BenchError, BenchOptions
from replay.bench.scores import act_scores, steady_scores
from replay.bench.session import run_bench
from replay.runner import GeneratorSource, RunOptions, replay
from synth import generators as g
from tests.replay.test_run_end_to_end import marks, needs, on_loop, uring
from traces import schema
from traces.errors import ReplayError, UnsafeTargetError
from traces.trace import open_trace

MIB = 1 << 20
KIB = 1 << 10
REPO = Path(__file__).resolve().parents[2]
RESULT_COLUMNS = ["op", "length", "intended_ns", "issue_ns", "complete_ns", "result"]


def chunks_of(path, columns=RESULT_COLUMNS):
    return open_trace(path).chunks(columns=columns)


def summary_of(path) -> RunSummary:
    summary = RunSummary()
    for chunk in chunks_of(path):
        summary.add(chunk)
    return summary


def bench_cli(*args, timeout=300):
    return replay_cli("bench", *args, cwd=REPO, timeout=timeout)


def make_file(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
    return str(path)


# ---- the runner on a generator ---------------------------------------------------------------


def test_a_finite_generator_is_replayed_row_for_row_on_the_null_engine(tmp_path):
    gen = g.random_mix(block_size={4096: 3, 16384: 1}, read_share=0.6, span=32 * MIB,
                       count=150_000, queue_depth=8, seed=3)
    out = tmp_path / "r.parquet"
    outcome = replay(gen, None, RunOptions(engine="null", timing="afap", qd=8), output=out,
                     metadata={"bench": {"test": "t", "run": "r", "role": "measure"}})
    assert not outcome.interrupted and not outcome.time_limited
    expected = {k: np.concatenate([c[k] for c in gen.chunks()]) for k in ("op", "offset", "length")}
    got = {k: np.concatenate([c[k] for c in chunks_of(out, list(expected))]) for k in expected}
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])
    tf = open_trace(out)
    md = tf.metadata
    assert md["kind"] == "results" and md["interrupted"] is False and md["rows_done"] == 150_000
    assert md["trace"]["rows"] == 150_000 and md["trace"]["path"] == "synth:random"
    assert md["trace"]["metadata"]["parameters"] == gen.parameters()
    assert md["bench"] == {"test": "t", "run": "r", "role": "measure"}
    assert set(schema.RESULT_COLUMNS) <= set(tf.column_names)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(read_share=st.floats(0, 1), count=st.integers(0, 5000), workers=st.integers(1, 4),
       qd=st.integers(1, 64), chunk_rows=st.integers(1, 3000), sequential=st.booleans(),
       seed=st.integers(0, 2**32))
def test_any_generator_run_keeps_every_row_in_order(tmp_path, read_share, count, workers, qd,
                                                    chunk_rows, sequential, seed):
    make = g.sequential_mix if sequential else g.random_mix
    gen = make(read_share=read_share, span=16 * MIB, count=count, queue_depth=qd, seed=seed)
    out = tmp_path / f"r{seed}.parquet"
    outcome = replay(gen, None, RunOptions(engine="null", timing="afap", qd=qd, workers=workers,
                                           chunk_rows=chunk_rows), output=out)
    assert outcome.rows == count and not outcome.interrupted
    cols = ("op", "offset", "length")
    want = [c for c in gen.chunks()]
    got = list(chunks_of(out, list(cols) + ["result"]))
    for name in cols:
        np.testing.assert_array_equal(
            np.concatenate([c[name] for c in got]) if got else np.empty(0, np.int64),
            np.concatenate([c[name] for c in want]) if want else np.empty(0, np.int64))
    assert all((c["result"] == c["length"]).all() for c in got)
    assert open_trace(out).metadata["trace"]["rows"] == count
    out.unlink()


def test_generator_source_knows_its_span_and_mix_without_a_pass():
    gen = g.Sequence("p", [g.Purge(span=64 * MIB), g.sequential_fill(span=64 * MIB)])
    source = GeneratorSource(gen)
    assert source.scan.span == 64 * MIB and source.scan.rows == 1 + 512
    assert source.buffer_length == 128 * KIB  # the purge's discard needs no buffer
    assert source.scan.counts[schema.Op.DISCARD] and source.scan.counts[schema.Op.WRITE]
    unbounded = GeneratorSource(g.random_mix(span=MIB, count=UNBOUNDED, read_share=1.0))
    assert unbounded.scan.rows == UNBOUNDED and not unbounded.scan.writes


def test_an_unbounded_run_stops_at_its_time_limit_and_is_not_interrupted(tmp_path):
    gen = g.random_mix(span=64 * MIB, unbounded=True, read_share=0.7, seed=1)
    out = tmp_path / "steady.parquet"
    outcome = replay(gen, None, RunOptions(engine="null", timing="afap", qd=32, time_limit_s=0.5),
                     output=out)
    assert outcome.time_limited and not outcome.interrupted
    md = open_trace(out).metadata
    assert md["interrupted"] is False and md["time_limited"] is True
    assert md["rows_done"] == outcome.rows == sum(len(c["op"]) for c in chunks_of(out))
    assert 0 < outcome.rows
    # Every row written was issued and completed: the stop reaped what was in flight.
    for chunk in chunks_of(out):
        assert (chunk["issue_ns"] >= 0).all() and (chunk["result"] == chunk["length"]).all()


@marks(uring, on_loop)
def test_a_generator_on_a_loop_device_with_io_uring(loop_device, tmp_path):
    device = loop_device(32 * MIB)
    fill = g.sequential_fill(span=32 * MIB)
    done = replay(fill, device, RunOptions(timing="afap", qd=32), output=tmp_path / "fill.parquet")
    assert done.rows == 256 and not done.interrupted
    assert open_trace(tmp_path / "fill.parquet").metadata["run"]["engine"] == "io_uring"
    gen = g.random_mix(span=32 * MIB, unbounded=True, read_share=0.5, queue_depth=32)
    out = tmp_path / "mix.parquet"
    outcome = replay(gen, device, RunOptions(timing="afap", qd=32, time_limit_s=0.5), output=out)
    assert outcome.time_limited and not outcome.interrupted and outcome.rows > 0
    for chunk in chunks_of(out):
        np.testing.assert_array_equal(chunk["result"], chunk["length"])  # no failed I/O
        assert (chunk["complete_ns"] >= chunk["issue_ns"]).all()


def test_a_bad_time_limit_is_refused(tmp_path):
    gen = g.random_mix(span=MIB, count=10)
    with pytest.raises(ReplayError, match="time limit must be a positive"):
        replay(gen, None, RunOptions(engine="null", time_limit_s=0), output=tmp_path / "x.parquet")
    assert not list(tmp_path.iterdir())


# ---- the standard tests, scored and rescored from the Parquet files -----------------------------


def check_results_set(out: Path, test: str) -> dict:
    results = json.loads((out / "results.json").read_text())
    assert results["format"] == "tracereplay-results-set" and results["version"] == 1
    assert results["test"] == test and results["interrupted"] is False
    assert results["finished"] and results["runs"]
    for run in results["runs"]:
        md = open_trace(out / run["file"]).metadata
        op = run["parameters"]["op"]  # said only by over-provisioned runs' files
        assert md["kind"] == "results" and md["bench"] == {"test": test, "run": run["name"],
                                                           "role": run["role"],
                                                           **({"op": op} if op else {})}
        assert run["interrupted"] is False and md["interrupted"] is False
        assert md["summary"]["tracereplay"] == run["summary"]
        assert run["summary"]["errors"] == 0
    return results


@marks(uring, on_loop)
def test_mix_on_a_loop_device(loop_device, tmp_path):
    device = loop_device(64 * MIB)
    out = tmp_path / "mix"
    results = run_bench("mix", device, out, BenchOptions(span=16 * MIB, duration_s=0.15))
    check_results_set(out, "mix")
    assert [r["role"] for r in results["runs"]][:1] == ["precondition"]
    table = results["scores"]["table"]
    assert len(table) == 21 and {(r["qd"], r["workers"]) for r in table} == {(3, 1), (32, 1), (1, 32)}
    for row in table:
        again = summary_of(out / f"{row['run']}.parquet")
        assert row["iops"] == pytest.approx(again.iops(), rel=1e-12) and row["iops"] > 0
        reads = again.ops[schema.Op.READ].ios / again.total().ios
        assert reads == pytest.approx(row["read_share"], abs=0.1)
    for split in ("1x3", "1x32", "32x1"):
        headline = next(r for r in table if r["run"] == f"{split}-r70")
        assert results["scores"][f"iops_70_30_{split}"] == headline["iops"]


@marks(uring, on_loop)
def test_seqmix_on_a_loop_device(loop_device, tmp_path):
    device = loop_device(32 * MIB)
    out = tmp_path / "seqmix"
    results = run_bench("seqmix", device, out, BenchOptions(duration_s=0.2, fill=False))
    check_results_set(out, "seqmix")
    assert [row["read_share"] for row in results["scores"]["table"]] == [1.0, 0.8, 0.6, 0.4, 0.2, 0.0, 0.7]
    for row in results["scores"]["table"]:
        again = summary_of(out / f"{row['run']}.parquet")
        assert row["mb_per_s"] == pytest.approx(again.mb_per_s(), rel=1e-12)
        assert again.total().ios > 0, row
        lengths = np.concatenate([c["length"] for c in chunks_of(out / f"{row['run']}.parquet")])
        assert (lengths == 128 * KIB).all()


@marks(uring, on_loop)
def test_steady_on_a_loop_device(loop_device, tmp_path):
    device = loop_device(32 * MIB)
    out = tmp_path / "steady"
    results = run_bench("steady", device, out,
                        BenchOptions(duration_s=3, window_s=2, round_s=1, max_rounds=25))
    check_results_set(out, "steady")
    assert [r["name"] for r in results["runs"]] == ["fill", "steady"]
    assert results["runs"][1]["parameters"]["time_limit_s"] == 3
    bins = scoring.consistency_bins()
    for chunk in chunks_of(out / "steady.parquet"):
        bins.add(chunk)
    again = steady_scores(bins, 2, 1, None, 3 * scoring.SECOND_NS)  # every round is checked
    s = results["scores"]
    assert s == {**json.loads(json.dumps(again)), "read_share": 0.0}
    assert len(s["iops_series"]) == 3 and s["window_s"] == 2
    c = scoring.consistency(bins, window_s=2, duration_ns=3 * scoring.SECOND_NS)
    assert s["steady_iops"] == c.average_iops > 0
    assert [r["round"] for r in s["steady_state"]["rounds"]] == [1, 2, 3]
    assert s["steady_state"]["reached"] is False  # three rounds cannot fill a 5-round window


@marks(uring, on_loop)
def test_act_search_on_a_loop_device(loop_device, tmp_path):
    device = loop_device(64 * MIB)
    out = tmp_path / "act"
    results = run_bench("act", device, out, BenchOptions(duration_s=1, period_s=1, search=True,
                                                         start=3, step=2))
    check_results_set(out, "act")
    s = results["scores"]
    tried = [t["multiple"] for t in s["tried"]]
    assert tried[0] == 3 and [r["name"] for r in results["runs"] if r["role"] == "measure"] == \
        [f"act-x{m:g}" for m in tried]
    for t, period in zip(s["tried"], s["periods"]):
        gen = g.act_load(multiple=t["multiple"], span=64 * MIB, duration_s=1)
        bins = scoring.act_bins(gen.transaction_max_length)
        for chunk in chunks_of(out / f"act-x{t['multiple']:g}.parquet"):
            bins.add(chunk)
        verdict = act_scores(bins, 1, 1)
        assert verdict["passed"] == period["passed"] == t["passed"]
        assert json.loads(json.dumps(verdict)) == {k: v for k, v in period.items()
                                                   if k not in ("multiple", "gave_up", "lateness")}
    passing = [t["multiple"] for t in s["tried"] if t["passed"]]
    assert s["act_multiple"] == (max(passing) if passing else 0)
    assert s["passed"] == bool(passing)


@marks(uring, on_loop)
def test_pts_on_a_loop_device(loop_device, tmp_path):
    device = loop_device(32 * MIB)
    out = tmp_path / "pts"
    results = run_bench("pts", device, out, BenchOptions(duration_s=0.1, max_rounds=5,
                                                         block_sizes=(4096,)))
    check_results_set(out, "pts")
    runs = results["runs"]
    assert runs[0]["name"] == "purge-fill" and runs[0]["role"] == "precondition"
    for name in ("purge-fill", "lat-purge-fill"):  # the latency test is purged afresh
        purge = next(chunks_of(out / f"{name}.parquet"))
        assert purge["op"][0] == schema.Op.DISCARD and purge["length"][0] == 32 * MIB
    names = [r["name"] for r in runs]
    assert names.index("lat-purge-fill") == names.index(next(n for n in names if n.startswith("lat-r"))) - 1
    assert results["scores"]["purge"]["pts_purge"] is True  # a loop device over a file
    s = results["scores"]
    assert len(s["iops_matrix"]) == 7 and len(s["latency"]) == 9
    rounds = len(s["iops_steady_state"]["rounds"])
    assert 1 <= rounds <= 5
    for row in s["iops_matrix"]:
        names = [f"iops-r{r:02d}-rs{round(row['read_share'] * 100)}-4k" for r in range(1, rounds + 1)]
        values = [summary_of(out / f"{n}.parquet").iops() for n in names][-5:]
        assert row["iops"] == pytest.approx(sum(values) / len(values), rel=1e-12)
    tracked = [summary_of(out / f"iops-r{r:02d}-rs0-4k.parquet").iops() for r in range(1, rounds + 1)]
    check = scoring.steady_state(tracked, max_rounds=5)
    assert s["iops_steady_state"]["reached"] == check.steady
    assert s["iops_steady_state"]["status"] == check.status


# ---- interruption and bad input -----------------------------------------------------------------


def test_ctrl_c_keeps_the_finished_runs_and_the_partial_one(tmp_path):
    out = tmp_path / "steady"
    with replay_process("bench", "steady", "--engine", "null", "--span", "64M", "--duration", "120",
                        "-o", out, cwd=REPO) as proc:
        wait_for(proc, lambda: glob.glob(f"{out}/steady.parquet.*.partial"), "the steady run")
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr
    results = json.loads((out / "results.json").read_text())
    assert results["interrupted"] is True
    assert [(r["name"], r["interrupted"]) for r in results["runs"]] == [("fill", False), ("steady", True)]
    md = open_trace(out / "steady.parquet").metadata
    assert md["interrupted"] is True and md["rows_done"] > 0
    assert not glob.glob(f"{out}/*.partial")
    assert results["scores"]["iops_series"], "the partial run is scored up to where it stopped"


def test_a_span_larger_than_the_target_says_which_span_to_use(tmp_path):
    target = make_file(tmp_path / "small.img", 16 * MIB)
    with pytest.raises(BenchError, match=r"spans 8\.0 GiB .* holds 16\.0 MiB; give --span 16777216 or less"):
        run_bench("mix", target, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    done = bench_cli("mix", target, "-o", tmp_path / "out")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: the mix test spans 8.0 GiB")
    assert len(done.stderr.strip().splitlines()) == 1


def test_an_unknown_test_and_a_missing_target_are_refused(tmp_path):
    with pytest.raises(BenchError, match="unknown test 'iometer': use one of mix, seqmix, steady, act, pts"):
        run_bench("iometer", None, tmp_path / "out", BenchOptions(engine="null"))
    done = bench_cli("iometer", "--engine", "null", "-o", tmp_path / "out")
    assert done.returncode == 2 and "Traceback" not in done.stderr and "iometer" in done.stderr
    done = bench_cli("steady", "-o", tmp_path / "out")
    assert done.returncode == 2
    assert done.stderr.strip() == ("error: give a TARGET (a block device or a regular file); only "
                                   "--engine null runs without one")
    assert not (tmp_path / "out").exists()


@marks(on_loop, needs("mkfs.ext4"))
def test_a_mounted_device_is_refused(loop_device, mounted, tmp_path):
    device = loop_device(32 * MIB)
    subprocess.run(["mkfs.ext4", "-q", "-F", device], check=True, capture_output=True)
    mounted(device)
    with pytest.raises(UnsafeTargetError, match="it is mounted"):
        run_bench("steady", device, tmp_path / "out", BenchOptions(duration_s=1))
    done = bench_cli("steady", device, "--duration", "1", "-o", tmp_path / "out")
    assert done.returncode == 2 and done.stderr.startswith(f"error: refusing to write to {device}")
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_the_cli_prints_a_table_and_a_valid_results_set(tmp_path):
    out = tmp_path / "act"
    done = bench_cli("act", "--engine", "null", "--span", "64M", "--multiple", "2",
                     "--duration", "1", "--period", "1", "-o", out)
    assert done.returncode == 0, done.stderr
    assert "ACT score: 2x" in done.stdout and f"results: {out}/results.json" in done.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["scores"]["act_multiple"] == 2 and results["options"]["multiple"] == 2
    assert results["target"]["kind"] == "null" and not math.isnan(results["runs"][0]["summary"]["iops"])


def test_every_bench_option_has_help_and_is_in_the_docs():
    import typer

    from replay.cli import app

    section = (REPO / "docs" / "standard-tests.md").read_text()
    command = typer.main.get_command(app).commands["bench"]
    assert "Example: replay bench" in command.help
    options = [p for p in command.params if p.opts[0].startswith("-")]
    assert len(options) >= 18
    for param in options:
        assert param.help, f"{param.opts[0]} has no help"
        long = max(param.opts, key=len)
        assert f"`{long}" in section, f"`replay bench {long}` is not in docs/standard-tests.md"
