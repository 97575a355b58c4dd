"""bench/floor.c, the floor the AFAP and lateness benchmarks measure ours against: it writes the
bytes ours writes, and its recording variant does the same I/Os as it; and the engine alone
(`_harness.py engine-alone`) does what `replay run` does."""
import subprocess
import sys

import numpy as np
import pytest

from replay.runner import RunOptions, replay
from tests.bench.test_scripts import BENCH
from traces.schema import Op
from traces.trace import write_trace

sys.path.insert(0, str(BENCH))
try:
    from _harness import build_floor, run_engine_alone, run_floor, write_floor_trace
finally:
    sys.path.remove(str(BENCH))

ROWS = 3000


@pytest.fixture(scope="module")
def floor(tmp_path_factory):
    return build_floor(tmp_path_factory.mktemp("floor"))


@pytest.fixture
def target_and_trace(tmp_path):
    target = tmp_path / "target.img"
    with open(target, "wb") as f:
        f.truncate(4 << 20)
    rng = np.random.default_rng(7)
    trace = write_floor_trace(tmp_path / "t.bin", np.zeros(ROWS, np.int64), rng.integers(0, 1024, ROWS) * 4096,
                              np.full(ROWS, 4096), (rng.random(ROWS) < 0.3).astype(np.uint32))
    return target, trace


@pytest.mark.parametrize("mode,arg", [("psync", 2), ("uring", 1), ("uring", 32), ("uring", 128)])
def test_the_recording_floor_does_every_io_of_the_trace(floor, target_and_trace, mode, arg):
    target, trace = target_and_trace
    for extra in ([], ["record"]):
        got = run_floor(floor, mode, target, trace, arg, *extra)
        assert got["ios"] == ROWS and got["iops"] > 0 and got["cpu_s"] > 0


def test_the_floor_refuses_a_word_it_does_not_know(floor, target_and_trace):
    target, trace = target_and_trace
    for args in (["psync", target, trace, "2", "recrod"], ["timed", target, trace]):
        done = subprocess.run([str(floor), *map(str, args)], capture_output=True, text=True)
        assert done.returncode == 2 and "usage: floor" in done.stderr


@pytest.mark.parametrize("mode,arg,engine", [("psync", 2, "psync"), ("uring", 8, "io_uring"), ("uring", 64, "io_uring")])
def test_the_floor_writes_the_bytes_ours_writes(floor, tmp_path, mode, arg, engine):
    # Each row writes its own block (the offsets a permutation), some longer than a page.
    n = 600
    rng = np.random.default_rng(3)
    offset = rng.permutation(n).astype(np.int64) * 16384
    length = rng.choice([4096, 8192, 16384], n).astype(np.int64)
    images = {}
    for who in ("floor", "ours"):
        images[who] = tmp_path / f"{who}.img"
        with open(images[who], "wb") as f:
            f.truncate(n * 16384)
    write_floor_trace(tmp_path / "t.bin", np.zeros(n, np.int64), offset, length, np.ones(n, np.uint32))
    assert run_floor(floor, mode, images["floor"], tmp_path / "t.bin", arg)["ios"] == n
    trace = write_trace(tmp_path / "t.parquet", {"ts_ns": np.zeros(n, np.int64), "op": np.full(n, Op.WRITE, np.uint8),
                                                "offset": offset, "length": length}, {"name": "t"})
    replay(trace, images["ours"], RunOptions(timing="afap", engine=engine, qd=arg, destroy_data=True),
           output=tmp_path / "r.parquet")
    floor_bytes, ours_bytes = (np.fromfile(images[who], np.uint8) for who in ("floor", "ours"))
    assert np.count_nonzero(ours_bytes) > n * 4096 * 0.99  # every block written, with random bytes
    assert np.array_equal(floor_bytes, ours_bytes)


@pytest.mark.parametrize("engine,qd", [("psync", 4), ("io_uring", 32)])
def test_the_engine_alone_writes_the_bytes_replay_writes(tmp_path, engine, qd):
    n = 600
    rng = np.random.default_rng(5)
    offset = rng.permutation(n).astype(np.int64) * 8192
    length = rng.choice([4096, 8192], n).astype(np.int64)
    trace = write_trace(tmp_path / "t.parquet", {"ts_ns": np.zeros(n, np.int64), "op": np.full(n, Op.WRITE, np.uint8),
                                                "offset": offset, "length": length}, {"name": "t"})
    images = {}
    for who in ("alone", "ours"):
        images[who] = tmp_path / f"{who}.img"
        with open(images[who], "wb") as f:
            f.truncate(n * 8192)
    got = run_engine_alone(trace, images["alone"], engine=engine, qd=qd)
    assert got["ios"] == n and got["iops"] > 0 and got["engine"] == engine and got["engine_cpu_s"] > 0
    replay(trace, images["ours"], RunOptions(timing="afap", engine=engine, qd=qd, destroy_data=True),
           output=tmp_path / "r.parquet")
    alone_bytes, ours_bytes = (np.fromfile(images[who], np.uint8) for who in ("alone", "ours"))
    assert np.count_nonzero(alone_bytes) > n * 4096 * 0.99  # every block written, with random bytes
    assert np.array_equal(alone_bytes, ours_bytes)
