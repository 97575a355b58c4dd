"""Opening results: real files made by the replayer (null engine), a results set laid out as
`replay bench` writes it, and every kind of bad input giving one ResultsError sentence."""
import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from analysis.results import Results, ResultsError, ResultsSet, load
from replay.runner import RunOptions, replay
from traces.schema import Op
from traces.trace import read_trace, write_trace


def _interrupt_once_done(done, total, elapsed):
    # Ctrl-C once some I/Os are done: at original timing (x4) the rest are still due. On the
    # second progress call of a closed-loop run it could land before any, leaving no rows.
    if done:
        raise KeyboardInterrupt


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """Real results files: demo at 20x (original timing), demo closed-loop, an interrupted run."""
    d = tmp_path_factory.mktemp("results")
    timed = replay("demo", None, RunOptions(engine="null", speed=20), output=d / "timed.parquet")
    afap = replay("demo", None, RunOptions(engine="null", timing="afap"), output=d / "afap.parquet")
    cut = replay("demo", None, RunOptions(engine="null", speed=4, chunk_rows=4096),
                 output=d / "cut.parquet", progress=_interrupt_once_done)
    assert cut.interrupted
    return {"timed": timed.output, "afap": afap.output, "cut": cut.output, "dir": d}


def test_results_file_exposes_metadata_and_rows(runs):
    r = load(runs["timed"])
    assert isinstance(r, Results)
    cols, meta = read_trace(runs["timed"])
    assert r.name == "demo" == meta["name"]
    assert r.rows == len(cols["op"]) > 1000
    assert r.target["kind"] == "null"
    assert r.run["mode"] == "original" and r.speed == 20 and not r.closed_loop
    assert r.interrupted is False
    assert r.role is None and r.parameters is None
    seen = sum(len(c["op"]) for c in r.chunks(["op"], rows=1000))
    assert seen == r.rows
    assert load(runs["afap"]).closed_loop


def test_summary_streamed_matches_the_one_stored_at_the_end_of_the_run(runs):
    r = load(runs["timed"])
    stored = r.metadata["summary"]["tracereplay"]
    rebuilt = r.summary.to_dict()["tracereplay"]
    for key in ("total_ios", "io_bytes", "duration_ns", "errors"):
        assert rebuilt[key] == stored[key], key
    assert rebuilt["all"]["clat_ns"]["percentile"] == stored["all"]["clat_ns"]["percentile"]
    assert r.summary_dict == r.metadata["summary"]
    cols, _ = read_trace(runs["timed"])
    assert r.summary.ops[Op.READ].ios == int(np.count_nonzero(cols["op"] == Op.READ))


def test_interrupted_run_is_marked(runs):
    r = load(runs["cut"])
    assert r.interrupted is True
    assert 0 < r.rows < load(runs["afap"]).rows


def _make_set(root, made, **changes):
    root.mkdir()
    entries = []
    for name, key, role in (("fill", "afap", "precondition"), ("r70-qd32", "timed", "measure")):
        shutil.copy(made[key], root / f"{name}.parquet")
        entries.append({"name": name, "file": f"{name}.parquet", "role": role,
                        "parameters": {"read_share": 0.7, "qd": 32}, "interrupted": False,
                        "summary": {}})
    doc = {"format": "tracereplay-results-set", "version": 1, "test": "mix",
           "target": {"path": "/dev/null", "kind": "null"}, "started": "", "finished": "",
           "interrupted": False, "options": {}, "runs": entries,
           "scores": {"iops_70_30_qd32": 1234.0, "table": []}}
    doc.update(changes)
    (root / "results.json").write_text(json.dumps(doc))
    return root


def test_results_set_lists_runs_with_roles(runs, tmp_path):
    root = _make_set(tmp_path / "set", runs)
    s = load(root)
    assert isinstance(s, ResultsSet)
    assert s.test == "mix" and s.scores["iops_70_30_qd32"] == 1234.0
    assert [r.role for r in s.runs] == ["precondition", "measure"]
    assert [r.run_name for r in s.measured()] == ["r70-qd32"]
    assert s.runs[1].parameters == {"read_share": 0.7, "qd": 32}
    assert s.runs[1].rows == load(runs["timed"]).rows
    assert s.interrupted is False
    assert isinstance(load(root / "results.json"), ResultsSet)


def test_results_set_with_an_interrupted_run_is_interrupted(runs, tmp_path):
    root = _make_set(tmp_path / "set", runs)
    shutil.copy(runs["cut"], root / "fill.parquet")
    assert load(root).interrupted is True


@pytest.mark.parametrize("case, words", [
    ("missing", "no such file or directory"),
    ("trace", "a trace, not the results"),
    ("garbage", "not a results file"),
    ("empty", "holds no I/Os"),
    ("bare_dir", "without results.json"),
    ("bad_json", "not readable as JSON"),
    ("not_a_set", "not a tracereplay results set"),
    ("no_runs", "lists no runs"),
    ("missing_run", "does not exist"),
])
def test_bad_input_is_one_clear_sentence(case, words, runs, tmp_path):
    path = tmp_path / "x.parquet"
    if case == "trace":
        path = tmp_path / "t.parquet"
        write_trace(path, {"ts_ns": np.array([0], np.int64), "op": np.array([0], np.uint8),
                           "offset": np.array([0], np.int64), "length": np.array([4096], np.int64)},
                    {"name": "t"})
    elif case == "garbage":
        path.write_bytes(b"PAR1 this is not parquet")
    elif case == "empty":  # a results file of no rows (replay itself refuses a 0-row trace)
        path = tmp_path / "e.parquet"
        pq.write_table(pq.read_table(runs["timed"]).slice(0, 0), path)
    elif case == "bare_dir":
        path = tmp_path / "d"
        path.mkdir()
    elif case == "bad_json":
        path = tmp_path / "d"
        path.mkdir()
        (path / "results.json").write_text("{\"format\": ")
    elif case == "not_a_set":
        path = _make_set(tmp_path / "d", runs, format="something-else")
    elif case == "no_runs":
        path = _make_set(tmp_path / "d", runs, runs=[])
    elif case == "missing_run":
        path = _make_set(tmp_path / "d", runs)
        (path / "fill.parquet").unlink()
    with pytest.raises(ResultsError) as info:
        load(path)
    message = str(info.value)
    assert words in message
    assert str(path) in message or str(path / "results.json") in message
    assert "\n" not in message


def test_one_pass_analysis_equals_each_analysis_alone(runs):
    """analyse reads the file once, in many small chunks on threads, and must give exactly what
    the summary, the time series and the fidelity give on their own."""
    from analysis.analyse import analyse
    from analysis.fidelity import fidelity
    from analysis.timeseries import time_series

    from analysis.summary import RunSummary

    r = load(runs["timed"])
    a = analyse(r, bin_ns=10_000_000, rows=1000)
    alone = load(runs["timed"])
    summary = RunSummary(jobname="demo")
    for chunk in alone.chunks(rows=1000):  # the same chunks: means are summed chunk by chunk
        summary.add(chunk)
    assert a.summary.to_dict() == summary.to_dict()
    assert r.summary is a.summary  # cached: no second pass
    series = time_series(alone.chunks(rows=777), bin_ns=10_000_000).to_dict()
    assert json.dumps(a.series.to_dict()) == json.dumps(series)
    assert a.fidelity.to_dict() == fidelity(alone, rows=1000).to_dict()
    assert a.fidelity.issued == a.summary.total().ios == r.rows
    only = analyse(load(runs["afap"]), summary=False, fidelity=False)
    assert only.summary is None and only.fidelity is None
    assert only.series.counts["all"].sum() == load(runs["afap"]).rows


def test_read_ahead_raises_in_order_and_stops_its_thread_when_left_early():
    import threading

    from analysis.results import _read_ahead

    closed = []

    def source(fail_at):
        try:
            for i in range(10):
                if i == fail_at:
                    raise ValueError(f"bad chunk {i}")
                yield i
        finally:
            closed.append(fail_at)

    got = []
    with pytest.raises(ValueError, match="bad chunk 4"):
        for i in _read_ahead(source(4), 2):
            got.append(i)
    assert got == [0, 1, 2, 3]
    before = threading.active_count()
    reader = _read_ahead(source(None), 1)
    assert next(reader) == 0
    reader.close()  # the caller stops early: the thread ends and the source is closed
    assert closed == [4, None]
    assert threading.active_count() == before
    assert list(_read_ahead(source(None), 3)) == list(range(10))
