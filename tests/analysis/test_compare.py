"""`replay compare` on real replays (null engine): side by side figures, noise from repeats or
the window bootstrap, and every kind of bad input as one line on stderr with exit code 2."""
import json
import os
import shutil
import signal

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.compare import CompareError, _hist_percentile, compare, windows
from analysis.results import load
from analysis.timeseries import N_BINS, bin_mid
from replay.runner import RunOptions, replay
from tests.cli_process import replay_cli
from traces.schema import Op
from traces.trace import write_trace


@pytest.fixture(scope="session")
def made(tmp_path_factory):
    d = tmp_path_factory.mktemp("compare")

    def run(name, **options):
        return replay("demo", None, RunOptions(engine="null", **options), output=d / f"{name}.parquet").output

    files = {"a": run("a", timing="afap"), "b": run("b", timing="afap", qd=4), "slow": run("slow", speed=2),
             "fast": run("fast", speed=8)}
    sent = []

    def stop(done, total, elapsed):
        # Ctrl-C (a real SIGINT to this process) once some I/Os are done: at original timing
        # (x4) the rest are still due. Progress may be reported from another thread, where
        # raising would not reach the run.
        if done and not sent:
            sent.append(done)
            os.kill(os.getpid(), signal.SIGINT)

    files["cut"] = replay("demo", None, RunOptions(engine="null", speed=4, chunk_rows=4096),
                          output=d / "cut.parquet", progress=stop).output
    trace = d / "other.parquet"
    write_trace(trace, {"ts_ns": np.arange(100, dtype=np.int64) * 1000,
                        "op": np.zeros(100, np.uint8), "offset": np.arange(100) * 4096,
                        "length": np.full(100, 4096)}, {"name": "other"})
    files["trace"] = trace
    files["other"] = replay(trace, None, RunOptions(engine="null", timing="afap"), output=d / "o.parquet").output
    return files


@settings(deadline=None, max_examples=60)
@given(st.lists(st.lists(st.integers(0, 20), min_size=3, max_size=3), min_size=1, max_size=4),
       st.sampled_from([1.0, 50.0, 99.0, 99.9, 100.0]))
def test_hist_percentile_matches_numpy(rows, q):
    """Each row's counts over three bins far apart; the ranked value's bin midpoint."""
    bins = np.array([3, 500, 1100])
    hist = np.zeros((len(rows), N_BINS))
    hist[:, bins] = rows
    got = _hist_percentile(hist, q)
    for r, counts in enumerate(rows):
        values = np.repeat([int(bin_mid(b)) for b in bins], counts)
        if not len(values):
            assert np.isnan(got[r])
        else:
            assert got[r] == np.percentile(values, q, method="inverted_cdf")


def test_windows_add_up_to_the_summary(made):
    r = load(made["slow"])
    w = windows(r, 50_000_000)
    s = r.summary
    for op in Op:
        assert w.count[:, int(op)].sum() == s.ops[op].ios
    assert w.count[:, 4].sum() == s.total().ios
    assert w.nbytes[:, 4].sum() == s.total().bytes
    assert w.waiting[:, 4].sum() == pytest.approx(s.total().workload.sum)
    assert w.dev_h[:, 4, :].sum() == s.total().ios


def test_a_run_against_its_own_copy_differs_nowhere(made, tmp_path):
    copy = tmp_path / "copy.parquet"
    shutil.copy(made["a"], copy)
    c = compare([made["a"], copy], labels=["one", "two"])
    assert [t.noise for t in c.targets] == ["bootstrap over time windows"] * 2
    keys = [m.key for m in c.metrics]
    assert {"all iops", "read device p99", "all workload p99.9", "waiting s", "duration s"} <= set(keys)
    for k in keys:
        assert c.ratio(k, 1) in (1.0, None)
        assert c.significant(k, 1) in (False, None)
        lo, hi = c.targets[0].intervals.get(k, (0, 0))
        assert lo <= hi


def test_four_times_the_rate_is_beyond_the_noise(made):
    c = compare([made["slow"], made["fast"]])
    assert c.significant("all iops", 1) is True
    assert c.ratio("all iops", 1) > 1
    d = c.to_dict()
    row = next(m for m in d["metrics"] if m["metric"] == "all iops")
    assert row["significant"] == [None, True]
    assert all(lo <= v <= hi for v, (lo, hi) in zip(row["values"], row["intervals"]))


def test_repeat_runs_give_their_range(made):
    c = compare([made["a"], made["b"], made["a"]], labels=["x", "y", "x"])
    x = c.targets[0]
    assert x.noise.startswith("2 repeat runs") and len(x.runs) == 2
    assert x.intervals["all iops"][0] == x.intervals["all iops"][1] == x.values["all iops"]


def test_results_sets_compare_run_by_run_and_their_scores(made, tmp_path):
    roots = []
    for name, key, score in (("s1", "a", 100.0), ("s2", "b", 150.0)):
        root = tmp_path / name
        root.mkdir()
        shutil.copy(made[key], root / "r70-qd32.parquet")
        doc = {"format": "tracereplay-results-set", "version": 1, "test": "mix",
               "target": {"path": f"/dev/{name}"}, "interrupted": False, "options": {},
               "runs": [{"name": "r70-qd32", "file": "r70-qd32.parquet", "role": "measure",
                         "parameters": {}, "interrupted": False, "summary": {}}],
               "scores": {"iops_70_30_qd32": score, "table": []}}
        (root / "results.json").write_text(json.dumps(doc))
        roots.append(root)
    c = compare(roots)
    assert c.kind == "bench test" and c.name == "mix"
    assert c.ratio("score iops_70_30_qd32", 1) == 1.5
    assert "r70-qd32: all iops" in [m.key for m in c.metrics]
    assert c.targets[0].label == "/dev/s1"


def test_cli_table_and_json(made):
    done = replay_cli("compare", made["a"], made["b"], "--label", "fast", "--label", "slow")
    assert done.returncode == 0, done.stderr
    assert "all iops" in done.stdout and "fast" in done.stdout and " x" in done.stdout
    done = replay_cli("compare", made["a"], made["b"], "--json")
    assert done.returncode == 0, done.stderr
    d = json.loads(done.stdout)
    assert d["name"] == "demo" and len(d["targets"]) == 2
    assert all(len(m["values"]) == 2 for m in d["metrics"])


def test_cli_marks_interrupted_runs_partial(made):
    done = replay_cli("compare", made["a"], made["cut"])
    assert done.returncode == 0, done.stderr
    assert "(partial)" in done.stdout and "figures are partial" in done.stdout


def test_help_names_every_option():
    done = replay_cli("compare", "--help")
    assert done.returncode == 0
    for flag in ("--label", "--force", "--json"):
        assert flag in done.stdout
    assert "Example: replay compare" in done.stdout


@pytest.mark.parametrize("case, words", [
    ("different", "'demo' but"),
    ("missing", "no such file or directory"),
    ("trace", "a trace, not the results"),
    ("empty", "holds no I/Os"),
    ("one", "at least two"),
    ("labels", "labels for"),
])
def test_cli_bad_input_is_one_line_and_exit_2(case, words, made, tmp_path):
    args = {
        "different": [made["a"], made["other"]],
        "missing": [made["a"], tmp_path / "nope.parquet"],
        "trace": [made["a"], made["trace"]],
        "one": [made["a"]],
        "labels": [made["a"], made["b"], "--label", "x"],
    }.get(case)
    if case == "empty":  # a results file of no rows (replay itself refuses a 0-row trace)
        empty = tmp_path / "er.parquet"
        pq.write_table(pq.read_table(made["a"]).slice(0, 0), empty)
        args = [made["a"], empty]
    done = replay_cli("compare", *args)
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith("error: ") and words in done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1


def test_force_compares_different_traces(made):
    with pytest.raises(CompareError, match="'other'"):
        compare([made["a"], made["other"]])
    c = compare([made["a"], made["other"]], force=True)
    assert any("different traces" in n for n in c.notes)


def test_scratch_runs_of_one_trace_are_one_target_labelled_scratch(tmp_path):
    """Without a TARGET, each run replays on its own temporary scratch file, removed after it:
    two such runs are repeat runs of one target, "scratch", not two deleted paths."""
    scratch = [replay("demo", None, RunOptions(timing="afap"), output=tmp_path / f"s{i}.parquet").output
               for i in (1, 2)]
    null = replay("demo", None, RunOptions(engine="null", timing="afap"), output=tmp_path / "n.parquet").output
    paths = [load(s).target["path"] for s in scratch]
    assert paths[0] != paths[1] and all(p.endswith("/scratch.img") for p in paths)
    c = compare([*scratch, null])
    assert [t.label for t in c.targets] == ["scratch", "(null engine)"]
    assert len(c.targets[0].runs) == 2 and c.targets[0].noise.startswith("2 repeat runs")
    done = replay_cli("compare", *scratch, null, "--json")
    assert done.returncode == 0, done.stderr
    assert [t["label"] for t in json.loads(done.stdout)["targets"]] == ["scratch", "(null engine)"]
