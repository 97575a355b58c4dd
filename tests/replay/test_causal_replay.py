"""Causal replay: the engine issues each I/O when its parents completed, plus think time, on
closed-loop workloads from a known model, the bundled traces and the capturing drive; the
options it refuses, and Ctrl-C.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis import causal
from tests.analysis.test_causal_inference import closed_loop, installer, model
from tests.cli_process import replay_cli
from traces.trace import open_trace


def _replay_model(cols, service_ns, step=1 << 16, think_scale=1.0, heuristic="chains"):
    """Annotate `cols` and replay them in causal mode on the null engine with a fixed service
    time, as the runner does; returns the annotation and the results columns."""
    from native import _engine

    ann = causal.Annotator(heuristic)
    rep = _engine.Replayer(None, engine="null", timing="causal", think_scale=think_scale, service_ns=service_ns,
                           depth=1024, max_length=4096)
    deps = []
    n = len(cols["ts_ns"])
    for s in range(0, n, step):
        part = {k: v[s:s + step] for k, v in cols.items()}
        a = ann.add(part)
        deps.append(a)
        rep.push(part["ts_ns"], part["op"], part["offset"], part["length"], None,
                 parent=a["parent"].astype(np.uint32), parent2=a["parent2"].astype(np.uint32),
                 think_ns=a["think_ns"])
    rep.close()
    out = []
    while (got := rep.take(True)) is not None:
        out.append(got)
    rep.join()
    res = {k: np.concatenate([o[i] for o in out]) for i, k in enumerate(("intended_ns", "issue_ns", "complete_ns", "result"))}
    return {k: np.concatenate([d[k] for d in deps]) for k in deps[0]}, res


@settings(max_examples=25, deadline=None)
@given(model, st.integers(1, 200), st.sampled_from([1.0, 0.5, 2.0]))
def test_causal_replay_of_a_closed_loop_model_follows_its_dependencies_exactly(m, step, think_scale):
    # The device of the model has one fixed latency, and the null engine that service time.
    service = m["latency"][0]
    cols, parent, think = closed_loop(
        m["threads"], min(m["ios"], 15), think=lambda r: r.integers(0, m["think_max"] + 1),
        latency=lambda r: service, seed=m["seed"])
    ann, res = _replay_model(cols, service, step, think_scale)
    rows = np.arange(len(parent))
    chained = parent >= 0
    # Every row ran, each took the service time, and went no earlier than its due time ...
    assert (res["issue_ns"] >= 0).all() and (res["result"] == 4096).all()
    np.testing.assert_array_equal(res["complete_ns"] - res["issue_ns"], service)
    assert (res["issue_ns"] >= res["intended_ns"]).all()
    # ... which is exactly its parent's completion on the target plus the model's think time,
    # scaled; a thread's first I/O follows the last completion before it, or without one
    # keeps its captured time.
    scaled = np.floor(think[chained] * think_scale + 0.5).astype(np.int64)  # Rust rounds half up
    np.testing.assert_array_equal(res["intended_ns"][chained], res["complete_ns"][parent[chained]] + scaled)
    np.testing.assert_array_equal(ann["parent"][chained], (rows - parent)[chained])
    first = ~chained & (ann["parent"] > 0)
    scaled = np.floor(ann["think_ns"][first] * think_scale + 0.5).astype(np.int64)
    np.testing.assert_array_equal(res["intended_ns"][first],
                                  res["complete_ns"][rows[first] - ann["parent"][first]] + scaled)
    roots = ann["parent"] == 0
    np.testing.assert_array_equal(res["intended_ns"][roots], cols["ts_ns"][roots])


def test_writeback_and_the_journal_follow_the_application_on_a_faster_drive():
    # Captured on a slow drive (1 ms an I/O), replayed on one 100x faster: the installer's
    # writes go sooner, and the journal's commit and the writeback that follow them go as
    # soon after them as they did in the capture, not at their own threads' captured pace.
    ms = 1_000_000
    cols = installer(250 * ms)
    n = len(cols["ts_ns"])
    cols.update(offset=np.arange(n, dtype=np.int64) * 4096, length=np.full(n, 4096, np.int64))
    _, res = _replay_model(cols, 10_000, heuristic="hybrid")
    done = res["complete_ns"]
    assert res["intended_ns"][5] == done[4] + 5 * ms
    assert res["intended_ns"][6] == done[5] + 250 * ms


YEAR_NS = 365 * 86_400 * 10**9


def _two_rows(rep, think):
    """Push row 0 (a root at 0) and row 1 (waits for row 0, then `think` ns)."""
    rep.push(np.zeros(2, np.int64), np.zeros(2, np.uint8), np.array([0, 4096]), np.full(2, 4096), None,
             parent=np.array([0, 1], np.uint32), parent2=np.zeros(2, np.uint32), think_ns=np.array([0, think]))


def _results(rep):
    out = []
    while (got := rep.take(True)) is not None:
        out.append(got)
    rep.join()
    return {k: np.concatenate([o[i] for o in out]) for i, k in enumerate(("intended_ns", "issue_ns", "complete_ns", "result"))}


@pytest.mark.parametrize("think,scale", [(2**63 - 1, 1.0), (YEAR_NS + 1, 1.0), (YEAR_NS, 1.5), (1, 1e308)])
def test_a_think_time_no_replay_can_wait_is_refused_naming_its_row(think, scale):
    # Its due time would pass i64's limit or be more than a year out: it once wrapped to a
    # time far in the past and went at once. The chunk is refused whole; the run goes on.
    from native import _engine

    rep = _engine.Replayer(None, engine="null", timing="causal", think_scale=scale, service_ns=1000, max_length=4096)
    with pytest.raises(ValueError, match=r"^push: row 1: a think time of \d+ ns .* is more than a year"):
        _two_rows(rep, think)
    _two_rows(rep, 0)
    rep.close()
    res = _results(rep)
    assert len(res["result"]) == 2 and (res["result"] == 4096).all()
    assert res["intended_ns"][1] == res["complete_ns"][0]


def test_a_think_time_of_a_year_is_waited_for_and_a_zero_scale_takes_it_off():
    import time

    from native import _engine

    # A year is the most a row may think: it is due a year after its parent, so it is not
    # issued before the run is stopped (a wrapped due time would send it at once).
    rep = _engine.Replayer(None, engine="null", timing="causal", service_ns=1000, max_length=4096)
    _two_rows(rep, YEAR_NS)
    rep.close()
    time.sleep(0.2)
    assert rep.take(False) is None, "row 1 went before its due time"
    rep.stop()
    intended, issue, complete, result, issued = rep.take(True)
    assert rep.join()["interrupted"] is True
    assert issued == 1 and issue[0] >= 0 and issue[1] == -1 and result[0] == 4096
    # With think_scale 0 even i64's largest think time is nothing: row 1 follows row 0.
    rep = _engine.Replayer(None, engine="null", timing="causal", think_scale=0.0, service_ns=1000, max_length=4096)
    _two_rows(rep, 2**63 - 1)
    rep.close()
    res = _results(rep)
    assert (res["result"] == 4096).all() and res["intended_ns"][1] == res["complete_ns"][0]


def test_causal_replay_of_a_bundled_trace_keeps_every_row_and_records_the_mode(tmp_path):
    out = tmp_path / "blob.parquet"
    done = replay_cli("run", "blob", "--engine", "null", "--timing", "causal", "-o", out, timeout=300)
    assert done.returncode == 0, done.stderr
    tf = open_trace(out)
    assert tf.metadata["run"]["mode"] == "causal" and tf.metadata["run"]["heuristic"] == "hybrid"
    from traces.trace import read_trace

    cols, _ = read_trace(out)
    from traces import library

    assert len(cols["op"]) == open_trace(library.resolve("blob")).num_rows
    assert (cols["issue_ns"] >= 0).all() and (cols["complete_ns"] >= cols["issue_ns"]).all()
    # The blob store spends most of its time thinking: with no device time at all (the null
    # engine) the replay still takes most of the captured span, and not more than it (+10 %).
    span = cols["complete_ns"].max() - cols["issue_ns"].min()
    captured = (cols["ts_ns"] + cols["latency_ns"]).max() - cols["ts_ns"].min()
    assert 0.5 * captured < span < 1.1 * captured


def test_causal_timing_refuses_a_trace_without_pid_or_latency_in_one_line(tmp_path):
    done = replay_cli("run", "demo", "--engine", "null", "--timing", "causal", "-o", tmp_path / "x.parquet")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "needs the columns pid and latency_ns" in lines[0] and "replay capture" in lines[0]
    assert not (tmp_path / "x.parquet").exists()


@pytest.mark.parametrize("extra,said", [(["--afap"], "exclude each other"),
                                        (["--workers", "2"], "one worker"),
                                        (["--read-only"], "--read-only")])
def test_causal_timing_refuses_options_it_cannot_honour(tmp_path, extra, said):
    done = replay_cli("run", "blob", "--engine", "null", "--timing", "causal", *extra, "-o", tmp_path / "x.parquet")
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_ctrl_c_in_a_causal_replay_keeps_every_completed_row(tmp_path):
    import glob
    import signal
    import time

    from tests.cli_process import replay_process, wait_for
    from traces.trace import read_trace

    out = tmp_path / "out.parquet"
    with replay_process("run", "oltp", "--engine", "null", "--timing", "causal", "--heuristic", "chains",
                        "-o", out, cwd=tmp_path) as proc:
        wait_for(proc, lambda: glob.glob(f"{out}.*.partial"), "the run's start")
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    tf = open_trace(out)
    assert tf.metadata["interrupted"] is True
    cols, _ = read_trace(out)
    assert 0 < len(cols["op"]) < tf.metadata["trace"]["rows"]
    assert (cols["issue_ns"] >= 0).all() and (cols["complete_ns"] >= cols["issue_ns"]).all()


@pytest.mark.root
@pytest.mark.loopdev
def test_causal_replay_on_the_capturing_drive_reproduces_the_application_time(tmp_path, loop_device):
    # The BLOB store (two clients contending on SQLite, so its sleeps are recorded and used),
    # captured twice on one drive (their difference is the noise), then the first capture
    # replayed causally on that drive: its I/O span is the captured one's within the noise or
    # 25 %. (Not the file copy: cp's own CPU time is not in its trace, and on a fast drive its
    # replay runs 22-34 % short, as docs/benchmarks.md says.)
    # The drive is a direct-I/O loop device over a throttled one (4,000 IOPS each way), as
    # bench/causal.py's slow drive, so its time is its own: a plain loop device's latency is
    # the host's CPU, which the application's clients took during the capture (60 us a request
    # against 40 us in the replay) and the replay leaves free, so the replay ran 3-28 % short.
    from bench.targets import root_throttle, stacked_loop
    from replay.runner import RunOptions, replay
    from traces.capture.recipes import load
    from traces.trace import read_trace

    lower = loop_device(1024 << 20)
    with root_throttle(lower, 4000, 4000, 256 << 20), stacked_loop(lower) as dev:
        spans = []
        for k in range(2):
            out = tmp_path / f"blob{k}.parquet"
            load("blob").run(dev, out, notices=[], ops=300, populate_mb=64, clients=2, memory_mb=128,
                             destroy_data=True)
            cols, _ = read_trace(out)
            spans.append((cols["ts_ns"] + cols["latency_ns"]).max() - cols["ts_ns"].min())
        noise = abs(spans[0] - spans[1]) / min(spans)
        res = tmp_path / "replay.parquet"
        replay(tmp_path / "blob0.parquet", dev, RunOptions(timing="causal", destroy_data=True, remap="wrap"),
               output=res)
    cols, meta = read_trace(res)
    assert meta["run"]["mode"] == "causal"
    span = cols["complete_ns"].max() - cols["issue_ns"].min()
    assert abs(span - spans[0]) / spans[0] <= max(noise, 0.25), (span, spans)
