"""The workload recipes of issue 24, each captured for real with its quick knobs on a scratch
loop device: the application's own outcome is recorded, the trace has the workload's shape
and validates, and nothing is left behind. A recipe whose Debian packages are missing skips,
naming them (`make deps` installs them).
"""
import numpy as np
import pytest

from tests.cli_process import replay_cli
from traces.capture.recipes import load
from traces.capture.recipes.common import missing_packages
from traces.schema import Op
from traces.trace import read_trace

pytestmark = [pytest.mark.root, pytest.mark.loopdev]


def recipe(name):
    """The recipe's module, or a skip naming the Debian packages it lacks."""
    module = load(name)
    lacking = missing_packages(module.TOOLS)
    if lacking:
        pytest.skip(f"recipe {name} needs the Debian package(s) {' '.join(lacking)}")
    return module


def captured(path):
    """The trace's columns, metadata and its recipe's outcome, after checking it verifies."""
    done = replay_cli("traces", "verify", path)
    assert done.returncode == 0, done.stdout + done.stderr
    columns, metadata = read_trace(path)
    outcome = metadata["recipe"]["outcome"]
    assert outcome["status"] == 0 and outcome["elapsed_s"] > 0
    assert 0 < outcome["cpu_user_s"] + outcome["cpu_system_s"]
    assert metadata["source"]["start_monotonic_ns"] < outcome["start_monotonic_ns"] < outcome["end_monotonic_ns"]
    return columns, metadata, outcome


def test_build_quick(tmp_path, clean):
    module = recipe("build")
    clean("build")
    out = tmp_path / "build.parquet"
    module.run(None, out, notices=[], targets="init/")
    cols, meta, outcome = captured(out)
    # init/ is a handful of C files; the compiler's output names each one.
    assert outcome["unit"] == "compilations" and outcome["compilations"] >= 5
    assert meta["recipe"]["applications"]["source"].startswith("linux-source-")
    assert meta["recipe"]["source_tree"]["files"] > 50_000
    reads = cols["op"] == Op.READ
    # From a cold cache, Kconfig parses every Kconfig file and the compiler reads the headers:
    # mostly small reads, by both.
    assert reads.sum() > 0.7 * np.count_nonzero(cols["op"] != Op.FLUSH)
    assert np.median(cols["length"][reads]) <= 16 * 1024
    readers = set(cols["comm"][reads])
    assert {"conf", "cc1"} <= readers, readers


def test_gitclone_quick(tmp_path, clean):
    module = recipe("gitclone")
    clean("gitclone")
    out = tmp_path / "gitclone.parquet"
    module.run(None, out, notices=[], subtree="fs")
    cols, meta, outcome = captured(out)
    repository = meta["recipe"]["repository"]
    assert repository["subtree"] == "fs" and repository["pack_bytes"] > 1 << 20
    # Every file of the commit was checked out, and git received every object of it.
    assert outcome["files"] == repository["files"] > 1000
    assert outcome["objects"] > outcome["files"]  # the blobs, plus the trees and the commit
    data = cols["op"] != Op.FLUSH
    writes = cols["op"] == Op.WRITE
    # A clone onto an empty filesystem writes: the pack, its index, the checked-out files,
    # all of it on the device by the time sync returns.
    assert writes.sum() > 0.9 * data.sum()
    assert cols["length"][writes].sum() >= repository["pack_bytes"]
