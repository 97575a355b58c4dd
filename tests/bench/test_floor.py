"""bench/floor.c, the floor the AFAP and lateness benchmarks measure ours against: its recording
variant keeps every I/O's times and result as a replayer must, and does the same I/Os."""
import subprocess
import sys

import numpy as np
import pytest

from tests.bench.test_scripts import BENCH

sys.path.insert(0, str(BENCH))
try:
    from _harness import build_floor, run_floor, write_floor_trace
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
