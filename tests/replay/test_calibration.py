"""Calibration before a causal replay (replay/calibrate.py): the replayer's own time per hop
between two ops, measured on the target and taken off the think times; where it is skipped.
"""
import numpy as np
import pytest

from traces.trace import write_trace


def test_pair_costs_are_the_median_gap_after_each_op_pair():
    from replay.calibrate import PATTERN, pair_costs
    from traces.schema import Op

    # A chain of the probe pattern where op b reaches the device `want[a, b]` ns after op a
    # completed (plus 1 us of jitter on every fourth hop, which the median ignores).
    want = {(a, b): 1_000 * (1 + 3 * a + b) for a in (0, 1, 3) for b in (0, 1, 3)}
    op = np.tile(np.array(PATTERN, np.uint8), 20)
    lat = np.full(len(op), 7_000, np.int64)
    ts = np.zeros(len(op), np.int64)
    for k in range(1, len(op)):
        ts[k] = ts[k - 1] + lat[k - 1] + want[int(op[k - 1]), int(op[k])] + (1_000 if k % 4 == 0 else 0)
    host = pair_costs(ts, op, lat)
    for (a, b), gap in want.items():
        assert host[a, b] == gap, (a, b)
    assert (host[Op.DISCARD, :] == host[Op.WRITE, :]).all() and (host[:, Op.DISCARD] == host[:, Op.WRITE]).all()


def _chain_trace(path, op, step_ns=100_000, latency_ns=50_000):
    """One process's chain of 4 KiB I/Os of `op` (an array), each issued `step_ns` after the one
    before, which took `latency_ns`: think time step - latency."""
    n = len(op)
    rows = np.arange(n, dtype=np.int64)
    write_trace(path, {"ts_ns": rows * step_ns, "op": np.asarray(op, np.uint8), "offset": rows * 4096,
                       "length": np.full(n, 4096, np.int64), "latency_ns": np.full(n, latency_ns, np.int64),
                       "pid": np.ones(n, np.int32)}, {"name": path.stem})
    return path


@pytest.mark.root
@pytest.mark.loopdev
def test_a_causal_replay_measures_the_replayers_own_time_per_io_on_a_block_device(tmp_path, loop_device):
    from replay.runner import RunOptions, replay
    from traces.schema import Op
    from traces.trace import read_trace

    dev = loop_device(64 << 20)
    rows = np.arange(300)
    trace = _chain_trace(tmp_path / "chain.parquet", np.where(rows % 3 == 2, Op.WRITE, Op.READ), 200_000, 100_000)
    notices = []
    replay(trace, dev, RunOptions(timing="causal", destroy_data=True), output=tmp_path / "r.parquet", notices=notices)
    cols, meta = read_trace(tmp_path / "r.parquet")
    host = np.array(meta["run"]["host_cost_ns"])
    # Every pair of read, write and flush was measured: a real gap, above 0 and under 10 ms.
    for a in (Op.READ, Op.WRITE, Op.FLUSH):
        for b in (Op.READ, Op.WRITE, Op.FLUSH):
            assert 0 < host[a, b] < 10_000_000, (a, b, host)
    assert any("the replayer's own time per I/O on " + dev in n for n in notices), notices
    # Each chained I/O is due at its parent's completion plus 100 us of think, less the cost.
    parent_done = cols["complete_ns"][:-1]
    cost = host[cols["op"][:-1], cols["op"][1:]]
    assert (cols["intended_ns"][1:] == parent_done + np.maximum(100_000 - cost, 0)).all()
    # Without calibration, the think time is replayed as captured.
    replay(trace, dev, RunOptions(timing="causal", destroy_data=True, calibrate=False), output=tmp_path / "p.parquet")
    cols, meta = read_trace(tmp_path / "p.parquet")
    assert meta["run"]["host_cost_ns"] is None
    assert (cols["intended_ns"][1:] == cols["complete_ns"][:-1] + 100_000).all()


def test_a_causal_replay_on_a_file_says_its_think_times_are_replayed_as_captured(tmp_path):
    from replay.runner import RunOptions, replay
    from traces.trace import read_trace

    target = tmp_path / "t.img"
    target.write_bytes(b"\0" * (4 << 20))
    trace = _chain_trace(tmp_path / "chain.parquet", np.zeros(20))
    notices = []
    replay(trace, target, RunOptions(timing="causal"), output=tmp_path / "r.parquet", notices=notices)
    assert read_trace(tmp_path / "r.parquet")[1]["run"]["host_cost_ns"] is None
    assert any("replayed as captured" in n for n in notices), notices


@pytest.mark.root
@pytest.mark.loopdev
def test_a_causal_replay_of_a_trace_that_only_reads_never_writes_probes(tmp_path, loop_device):
    # The probes write the target's first 2 MiB; a trace that only reads was never cleared to
    # write (a mounted or partitioned disk replays its reads), so nothing is measured.
    from replay.runner import RunOptions, replay
    from traces.trace import read_trace

    dev = loop_device(8 << 20)
    pattern = bytes(range(256)) * (8 << 12)
    with open(dev, "r+b") as f:
        f.write(pattern)
    trace = _chain_trace(tmp_path / "reads.parquet", np.zeros(30))
    notices = []
    replay(trace, dev, RunOptions(timing="causal"), output=tmp_path / "r.parquet", notices=notices)
    assert read_trace(tmp_path / "r.parquet")[1]["run"]["host_cost_ns"] is None
    assert any("does not write" in n for n in notices), notices
    with open(dev, "rb") as f:
        assert f.read(len(pattern)) == pattern
