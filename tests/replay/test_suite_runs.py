"""`replay suite`: a library of captured workloads replayed on one target into one results set,
scored from its files; what it refuses, before anything is written; and the fill of
`--state full`. The library here is two short cuts of bundled captures (and the synthetic
demo, which is no workload), so that a suite takes seconds.
"""
import json
import signal
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from analysis.results import ResultsSet, load
from analysis.suite import columns_of, score_workload
from replay.bench.suite import STATES
from replay.commands.suite import State
from tests.cli_process import replay_cli, replay_process, wait_for
from tests.replay.test_run_end_to_end import marks, on_loop, uring
from traces import library
from traces.errors import TraceFormatError
from traces.schema import Op
from traces.trace import read_journal

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[2]
# Rows of each bundled capture kept: about a second of each, and 180 MB of filecopy's writes,
# a few seconds on the throttled drive of the pair.
CUTS = {"filecopy": 150, "oltp": 2000}


def short_library(directory: Path, cuts=CUTS) -> Path:
    """The first rows of bundled captures, with their metadata, and the synthetic demo."""
    directory.mkdir(exist_ok=True)
    for name, rows in cuts.items():
        table = pq.read_table(library.resolve(name))
        pq.write_table(table.slice(0, rows), directory / f"{name}.parquet")
    pq.write_table(pq.read_table(library.resolve("demo")).slice(0, 100), directory / "demo.parquet")
    return directory


def suite_cli(*args, timeout=120) -> subprocess.CompletedProcess:
    return replay_cli("suite", *args, cwd=REPO, timeout=timeout)


def test_the_cli_states_are_the_suites():
    assert [s.value for s in State] == list(STATES)


def test_a_suite_on_the_null_engine_is_one_results_set_scored_from_its_files(tmp_path):
    lib = short_library(tmp_path / "lib")
    out = tmp_path / "out"
    done = suite_cli("--engine", "null", "--library", lib, "-o", out, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc == json.loads((out / "results.json").read_text())
    assert [r["name"] for r in doc["runs"]] == ["filecopy", "oltp"]  # not the synthetic demo
    assert sorted(p.name for p in out.iterdir()) == ["filecopy.parquet", "oltp.parquet", "results.json"]
    s = load(out)
    assert isinstance(s, ResultsSet) and s.test == "suite"
    by_name = {w["name"]: w for w in doc["scores"]["suite"]["workloads"]}
    for run in s.measured():
        assert run.rows == CUTS[run.name] and run.run["mode"] == "causal"
        # The stored scores are those of the results file, recomputed here.
        again = score_workload(run.name, columns_of(run)).to_dict()
        assert by_name[run.name] == again  # JSON keeps floats exactly
        # The capture's run time: the cut's first issue to its last captured completion.
        cut = pq.read_table(lib / f"{run.name}.parquet").to_pydict()
        ts, lat = np.array(cut["ts_ns"]), np.array(cut["latency_ns"])
        assert again["capture_ns"] == (ts + lat).max() - ts.min()
    overall = doc["scores"]["suite"]["overall"]
    assert overall["ios"] == sum(CUTS.values())
    assert overall["run_time_ns"] == sum(w["run_time_ns"] for w in by_name.values())
    # Run again into the same directory: its files are replaced, as a bench's are.
    again = suite_cli("--engine", "null", "--library", lib, "-o", out, "--only", "oltp", "--json")
    assert again.returncode == 0, again.stderr
    assert [r["name"] for r in json.loads(again.stdout)["runs"]] == ["oltp"]


def test_a_stop_signal_keeps_the_workloads_done_and_the_one_it_stopped(tmp_path):
    """SIGTERM while the second workload runs (oltp whole: 40 s of causal replay, even on the
    null engine, which keeps its think times): exit 143, both runs kept, the second marked
    interrupted and scored over the I/Os it did."""
    lib = short_library(tmp_path / "lib", {"filecopy": 150})
    pq.write_table(pq.read_table(library.resolve("oltp")), lib / "oltp.parquet")
    out = tmp_path / "out"
    with replay_process("suite", "--engine", "null", "--library", lib, "-o", out) as proc:
        index = out / "results.json"
        wait_for(proc, lambda: index.exists() and json.loads(index.read_text())["runs"], "the first workload")
        wait_for(proc, lambda: list(out.glob("oltp.parquet.*.partial")), "the second workload's journal")
        journal = next(out.glob("oltp.parquet.*.partial"))

        def rows_in_journal():  # the file is made, then its schema written, then its rows
            try:
                return sum(b.num_rows for b in read_journal(journal)[2])
            except TraceFormatError:
                return 0

        wait_for(proc, lambda: rows_in_journal() > 0, "the second workload's first rows")
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    doc = json.loads(index.read_text())
    assert doc["interrupted"] and [(r["name"], r["interrupted"]) for r in doc["runs"]] == [
        ("filecopy", False), ("oltp", True)]
    scored = {w["name"]: w for w in doc["scores"]["suite"]["workloads"]}
    assert not scored["filecopy"]["partial"] and scored["oltp"]["partial"]
    assert 0 < scored["oltp"]["ios"] < 136_333
    assert "oltp *" in stdout and "interrupted" in stderr


@pytest.mark.parametrize("args, says", [
    (["--only", "oltp,nosuch"], "--only: nosuch is no workload of the suite; its workloads are filecopy, oltp"),
    (["--skip", "filecopy,oltp"], "--only and --skip leave no workload"),
    (["--only", "demo"], "demo is no workload"),
])
def test_workloads_that_are_not_there_are_refused_before_anything_is_written(tmp_path, args, says):
    lib = short_library(tmp_path / "lib")
    done = suite_cli("--engine", "null", "--library", lib, "-o", tmp_path / "out", *args)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_no_target_is_refused_unless_the_null_engine(tmp_path):
    done = suite_cli("-o", tmp_path / "out")
    assert done.returncode == 2 and "give a TARGET" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


@marks(on_loop, uring)
def test_a_target_in_use_is_refused_for_every_workload_before_anything_is_written(tmp_path, loop_device):
    dev = loop_device(64 * MIB)
    subprocess.run(["mkfs.ext4", "-q", dev], check=True)
    lib = short_library(tmp_path / "lib")
    done = suite_cli(dev, "--library", lib, "-o", tmp_path / "out", "--remap", "wrap")
    assert done.returncode == 2 and "--destroy-data" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()
    assert subprocess.run(["blkid", "-o", "value", "-s", "TYPE", dev], capture_output=True,
                          text=True).stdout.strip() == "ext4"
    # A workload larger than the target: refused as replay run refuses it, naming both sizes.
    done = suite_cli(dev, "--library", lib, "-o", tmp_path / "out", "--destroy-data")
    assert done.returncode == 2 and "--remap" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


@marks(on_loop, uring)
def test_state_full_fills_the_whole_target_before_the_workloads(tmp_path, loop_device):
    size = 64 * MIB
    dev = loop_device(size)
    lib = short_library(tmp_path / "lib", {"filecopy": 300})
    out = tmp_path / "out"
    done = suite_cli(dev, "--library", lib, "-o", out, "--remap", "wrap", "--state", "full")
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "results.json").read_text())
    assert [(r["name"], r["role"]) for r in doc["runs"]] == [("fill", "precondition"), ("filecopy", "measure")]
    fill = load(out / "fill.parquet")
    cols = next(fill.chunks(["op", "offset", "length", "result"], rows=1 << 30))
    assert (cols["op"] == Op.WRITE).all() and (cols["result"] == cols["length"]).all()
    # Every byte of the target written, once, in order.
    assert cols["offset"][0] == 0 and (np.diff(cols["offset"]) == cols["length"][:-1]).all()
    assert int(cols["length"].sum()) == size
    # The table names the workload and the composite; the fill is no workload of it.
    rows = [line.split()[0] for line in done.stdout.splitlines()[2:] if line.strip()]
    assert rows[:2] == ["filecopy", "overall"] and "composite (ours" in done.stdout
    assert [r.name for r in load(out).measured()] == ["filecopy"]


def test_two_drives_suites_read_as_sets_by_verdict_compare_and_report(drive_pair, tmp_path):
    """One suite on each drive of the pair, then each reading command given the two
    directories, and nothing else."""
    lib = short_library(tmp_path / "lib")
    out = {}
    for name, dev in (("fast", drive_pair.fast), ("slow", drive_pair.slow)):
        out[name] = tmp_path / name
        done = drive_pair.replay(dev, "suite", dev, "--library", lib, "-o", out[name], "--remap", "wrap",
                                 "--destroy-data")
        assert done.returncode == 0, done.stderr
    scores = {name: json.loads((d / "results.json").read_text())["scores"]["suite"] for name, d in out.items()}
    run_time = {name: {w["name"]: w["run_time_ns"] for w in s["workloads"]} for name, s in scores.items()}

    labels = ("--label-a", "slow", "--label-b", "fast")
    done = replay_cli("verdict", "--traces-a", out["slow"], "--traces-b", out["fast"], *labels, "--json")
    assert done.returncode == 0, done.stderr
    v = json.loads(done.stdout)
    assert v["synthetic"] == [] and sorted(w["name"] for w in v["workloads"]) == sorted(CUTS)
    for w in v["workloads"]:  # causal replays: the time to finish is the suite's run time
        assert w["mode"] == "causal"
        assert w["finish_ratio"] == pytest.approx(run_time["slow"][w["name"]] / run_time["fast"][w["name"]])
    # The faster drive, by the geometric mean of the ratios, and where it changes the run time
    # by more than 10 % of the slower drive's.
    ratios = [run_time["slow"][n] / run_time["fast"][n] for n in CUTS]
    faster = "fast" if np.prod(ratios) >= 1 else "slow"
    assert v["faster"] == faster
    fast_over_slow = {n: (1 / r if faster == "fast" else r) for n, r in zip(CUTS, ratios)}
    changed = {n: f for n, f in fast_over_slow.items() if abs(f - 1) > 0.10}
    assert v["run_time_change"] == {"threshold": 0.1, "compared": 2, "changed": pytest.approx(changed)}
    table = replay_cli("verdict", "--traces-a", out["slow"], "--traces-b", out["fast"], *labels).stdout
    assert (f"{faster} changes the run time by more than 10% in {len(changed)} of the 2 workloads "
            "replayed to finish") in table

    done = replay_cli("compare", out["slow"], out["fast"], "--label", "slow", "--label", "fast", "--json")
    assert done.returncode == 0, done.stderr
    metrics = {m["metric"]: m for m in json.loads(done.stdout)["metrics"]}
    for name in CUTS:
        assert metrics[f"{name}: duration s"]["values"] == pytest.approx(
            [run_time["slow"][name] / 1e9, run_time["fast"][name] / 1e9], rel=0.01)
    assert metrics["score composite"]["values"] == [scores["slow"]["composite"], scores["fast"]["composite"]]

    page = tmp_path / "report.html"
    done = replay_cli("report", out["slow"], out["fast"], "--label", "slow", "--label", "fast", "-o", page)
    assert done.returncode == 0, done.stderr
    html = page.read_text()
    suite_part = html.split("<h2>Real-use suite</h2>", 1)[1].split("<h2>", 1)[0]
    assert "<h3>slow, causal timing</h3>" in suite_part and "<h3>fast, causal timing</h3>" in suite_part
    assert "Verdict" in html and f"{faster} changes the run time by more than 10%" in html
