"""Capture recipes run for real with small knobs on scratch loop devices: each trace validates
and has its workload's shape, nothing is left behind (loop devices, mounts, cgroups,
processes), a failing or interrupted recipe still tears down, and a device in use is refused.
"""
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import cli_process
from tests.cli_process import replay_process
from traces.capture.recipes import RECIPES, RecipeError, load, names
from traces.capture.recipes.common import MIB, Session, parse_knobs
from traces.errors import ReplayError
from traces.schema import Op
from traces.trace import open_trace, read_trace

OURS = ("oltp", "blob", "blobclosed", "filecopy", "build", "gitclone", "dpkg", "mariadb", "rocksdb", "photos", "video", "web",
        "office")
root_loop = [pytest.mark.root, pytest.mark.loopdev]


def replay_cli(*args, timeout=300):
    return cli_process.replay_cli(*args, timeout=timeout)


def _ops(cols):
    return {op: int(np.count_nonzero(cols["op"] == op)) for op in Op}


# -- knobs and the registry -------------------------------------------------------------

def test_registry_has_our_recipes_with_described_knobs():
    assert set(OURS) <= set(names()) <= set(RECIPES)
    for name in OURS:
        module = load(name)
        assert module.DESCRIPTION.endswith(".")
        for knob, (type_, default, help_) in module.KNOBS.items():
            # None: an optional knob, off unless given (fixed work: --transactions, --ops)
            assert (default is None or isinstance(default, type_)) and help_.endswith("."), knob
            assert knob not in ("device", "output", "backend", "destroy_data")


def test_unknown_recipe_lists_the_recipes():
    with pytest.raises(RecipeError, match="oltp") as info:
        load("nosuch")
    assert isinstance(info.value, ReplayError)


def test_parse_knobs_converts_fills_and_refuses():
    spec = load("oltp").KNOBS
    knobs = parse_knobs(spec, {"clients": "3", "duration": 2})
    assert knobs["clients"] == 3 and knobs["duration"] == 2.0 and knobs["scale"] == spec["scale"][1]
    with pytest.raises(RecipeError, match="unknown knob 'client'"):
        parse_knobs(spec, {"client": 3})
    with pytest.raises(RecipeError, match="clients: 'many' is not a int"):
        parse_knobs(spec, {"clients": "many"})
    with pytest.raises(RecipeError, match="must be positive"):
        parse_knobs(spec, {"duration": 0})


def test_recipe_cli_lists_knobs_and_documents_every_option():
    done = replay_cli("capture", "recipe", "--list")
    assert done.returncode == 0, done.stderr
    page = (Path(__file__).resolve().parents[3] / "docs" / "capture.md").read_text()
    assert "replay capture recipe" in page
    for name in OURS:
        assert f"{name}: " in done.stdout
        helped = replay_cli("capture", "recipe", name, "--help")
        assert helped.returncode == 0 and f"Example: replay capture recipe {name}" in helped.stdout
        for knob in load(name).KNOBS:
            flag = "--" + knob.replace("_", "-")
            assert flag in done.stdout and flag in helped.stdout
            assert flag in page, f"{flag} of recipe {name} is not in docs/capture.md"
    for flag in ("--output", "--backend", "--destroy-data", "--list"):
        assert flag in page
    # The plain form still works as before.
    assert "--strict" in replay_cli("capture", "--help").stdout


def test_recipe_cli_refuses_an_unknown_knob():
    done = replay_cli("capture", "recipe", "oltp", "-o", "x.parquet", "--client", "3")
    assert done.returncode == 2 and "--client" in done.stderr


# -- real runs ----------------------------------------------------------------------------

@pytest.mark.root
@pytest.mark.loopdev
def test_oltp_short_run(tmp_path, clean):
    clean("oltp")
    out = tmp_path / "oltp.parquet"
    notices = []
    result = load("oltp").run(None, out, notices=notices, duration=3, scale=1, clients=2,
                              memory_mb=128, shared_buffers_mb=16)
    cols, meta = read_trace(out)
    ops = _ops(cols)
    assert result.rows == len(cols["op"]) > 100
    assert ops[Op.WRITE] > 0 and ops[Op.FLUSH] > 0  # commits write and flush the WAL
    data = cols["length"][cols["op"] != Op.FLUSH]
    sizes, counts = np.unique(data, return_counts=True)
    assert sizes[np.argmax(counts)] == 8192  # PostgreSQL's page
    recipe = meta["recipe"]
    assert recipe["recipe"] == "oltp" and recipe["knobs"]["clients"] == 2
    assert "PostgreSQL" in recipe["applications"]["postgres"]
    assert recipe["filesystem"]["type"] == "ext4" and recipe["memory"]["memory_limit_bytes"] == 128 * MIB
    assert {"kernel", "backend", "date"} <= set(recipe)
    assert meta["source"]["recipe"] == "oltp" and "pgbench" in meta["description"]
    assert "postgres" in set(cols["comm"])


@pytest.mark.root
@pytest.mark.loopdev
def test_blob_short_run(tmp_path, clean):
    clean("blob")
    out = tmp_path / "blob.parquet"
    load("blob").run(None, out, notices=[], duration=3, populate_mb=128, clients=2, rate=80, memory_mb=96)
    cols, meta = read_trace(out)
    ops = _ops(cols)
    assert ops[Op.READ] > 0 and ops[Op.WRITE] > 0 and ops[Op.FLUSH] > 0  # GETs; durable PUTs
    reads = cols["op"] == Op.READ
    # Blob bodies are 64 KiB and more: reads of 64 KiB or larger exist.
    assert cols["length"][reads].max() >= 64 * 1024
    import sqlite3
    assert meta["recipe"]["applications"]["sqlite"] == sqlite3.sqlite_version


@pytest.mark.root
@pytest.mark.loopdev
def test_filecopy_onto_a_given_device(tmp_path, loop_device, clean):
    clean("filecopy")
    dev = loop_device(1024 * MIB)
    out = tmp_path / "copy.parquet"
    load("filecopy").run(dev, out, notices=[], size_mb=48)
    cols, meta = read_trace(out)
    writes = cols["op"] == Op.WRITE
    written = int(cols["length"][writes].sum())
    assert written >= 48 * MIB  # every byte copied reached the device before sync returned
    assert np.count_nonzero(writes) > 0.8 * np.count_nonzero(cols["op"] != Op.FLUSH)
    assert meta["recipe"]["source_folder"]["bytes"] >= 48 * MIB - 16
    assert meta["recipe"]["device"]["path"] == os.path.realpath(dev)
    assert "coreutils" in meta["recipe"]["applications"]["cp"]
    # cp's own CPU time, the part of its run no block trace shows: copying 48 MiB is not free,
    # and one process cannot spend more CPU than the run lasted.
    outcome = meta["recipe"]["outcome"]
    assert 0 < outcome["cpu_user_s"] + outcome["cpu_system_s"] <= outcome["elapsed_s"]
    # The recipe's filesystem is gone from the device's mounts, and the device is still ours.
    assert dev not in Path("/proc/self/mounts").read_text()


@pytest.mark.root
@pytest.mark.loopdev
def test_a_device_in_use_is_refused(tmp_path, loop_device, mounted, clean):
    clean("filecopy")
    dev = loop_device(64 * MIB)
    subprocess.run(["mkfs.ext4", "-q", dev], check=True, capture_output=True)
    where = mounted(dev)
    (where / "precious").write_text("keep me")
    with pytest.raises(RecipeError, match="--destroy-data"):
        load("filecopy").run(dev, tmp_path / "x.parquet", notices=[], size_mb=8)
    assert (where / "precious").read_text() == "keep me"
    assert not (tmp_path / "x.parquet").exists()
    done = replay_cli("capture", "recipe", "filecopy", dev, "-o", tmp_path / "x.parquet", "--size-mb", "8")
    assert done.returncode == 2 and done.stderr.startswith("error: ") and "mounted" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.root
@pytest.mark.loopdev
def test_a_failing_workload_still_tears_down(tmp_path, clean):
    clean("failing")
    out = tmp_path / "fail.parquet"
    with pytest.raises(RecipeError, match="exited with status 3"):
        with Session("failing", {}, []) as s:
            dev = s.scratch_loop(64 * MIB)
            mnt = s.filesystem(dev)
            cgroup = s.memory_cgroup(32 * MIB)
            # A straggler keeps running in the cgroup and holds the filesystem busy.
            script = f"sleep 300 < /dev/null > {mnt}/busy 2>&1 & exit 3"
            s.capture(dev, out, command=cgroup.wrap(["sh", "-c", script]), description="fails.")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.root
@pytest.mark.loopdev
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_recipe_tears_down(tmp_path, clean, sig):
    out = tmp_path / "blob.parquet"
    with replay_process("capture", "recipe", "blob", "-o", out, "--duration", "120",
                        "--populate-mb", "16", "--rate", "20", "--clients", "1") as proc:
        clean("blob", proc.pid)
        for line in proc.stderr:
            if "tracing with" in line:
                break
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not out.exists()


# -- fixed work: the recipes record the application's own outcome ------------------------

@pytest.mark.root
@pytest.mark.loopdev
def test_oltp_fixed_work_records_pgbench_outcome(tmp_path):
    from traces.capture.recipes import load

    out = tmp_path / "oltp.parquet"
    load("oltp").run(None, out, notices=[], transactions=50, seed=3, scale=1, clients=2,
                     memory_mb=128, shared_buffers_mb=16)
    meta = open_trace(out).metadata
    outcome = meta["recipe"]["outcome"]
    assert outcome["transactions"] == 100 and outcome["status"] == 0
    assert outcome["tps"] > 0 and outcome["latency_ms"] > 0 and outcome["elapsed_s"] > 0
    assert "-t 50 --random-seed=3" in meta["recipe"]["workload"]
    assert "50 transactions per client (seed 3)" in meta["description"]
    # The run's start and end on the trace's clock: after the capture started, elapsed apart.
    start, end = outcome["start_monotonic_ns"], outcome["end_monotonic_ns"]
    assert meta["source"]["start_monotonic_ns"] < start < end
    assert (end - start) / 1e9 == pytest.approx(outcome["elapsed_s"])


@pytest.mark.root
@pytest.mark.loopdev
def test_blob_fixed_work_records_operations_and_latency(tmp_path):
    from traces.capture.recipes import load

    out = tmp_path / "blob.parquet"
    load("blob").run(None, out, notices=[], ops=60, populate_mb=64, clients=2, memory_mb=128)
    outcome = open_trace(out).metadata["recipe"]["outcome"]
    assert outcome["operations"] == 60 and sum(outcome["by_op"].values()) == 60
    assert outcome["ops_per_s"] > 0 and outcome["latency_ms"]["p99"] >= outcome["latency_ms"]["p50"] > 0
    assert outcome["elapsed_s"] >= outcome["store_elapsed_s"] > 0
    assert 0 < outcome["cpu_user_s"] + outcome["cpu_system_s"] <= outcome["elapsed_s"] * os.cpu_count()
    # The clients' sleeps (SQLite's busy handler) are traced with the blob store's I/O.
    sleeps = open_trace(out).metadata["source"]["sleeps"]
    assert sleeps is not None and len(sleeps["pid"]) == len(sleeps["start_ns"]) == len(sleeps["end_ns"])


# -- installing packages starts no service ------------------------------------------------

def test_no_service_starts_while_a_recipe_installs(tmp_path):
    from traces.capture.recipes.common import no_service_starts

    policy = tmp_path / "policy-rc.d"
    with no_service_starts(policy):
        # What Debian's invoke-rc.d runs before starting a service: 101 is "not allowed".
        assert subprocess.run([policy, "nginx", "start"]).returncode == 101
    assert not policy.exists()
    with pytest.raises(RecipeError, match="apt-get failed"):
        with no_service_starts(policy):
            assert policy.exists()
            raise RecipeError("apt-get failed")
    assert not policy.exists()
    # The host's own policy is used as it is, and stays.
    policy.write_text("#!/bin/sh\nexit 0\n")
    policy.chmod(0o755)
    with no_service_starts(policy):
        assert subprocess.run([policy, "nginx", "start"]).returncode == 0
    assert policy.read_text() == "#!/bin/sh\nexit 0\n"


def test_no_service_starts_says_when_it_cannot_hold_them(tmp_path):
    from traces.capture.recipes.common import no_service_starts

    with pytest.raises(RecipeError, match="cannot write .* services from starting"):
        with no_service_starts(tmp_path / "no-such-folder" / "policy-rc.d"):
            pass


# -- the BLOB store's load generator --------------------------------------------------------

def test_blob_load_reports_thousands_of_operations_per_client(tmp_path):
    # One client's report of 8,000 latencies is larger than the queue's pipe: the store must
    # read it while the client runs, or the client never exits and the run never ends.
    import json
    import sys

    load_ = [sys.executable, "-m", "traces.capture.recipes.blob_load"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    subprocess.run([*load_, "populate", tmp_path, "--mb", "16"], check=True, env=env, timeout=60)
    outcome = tmp_path / "outcome.json"
    subprocess.run([*load_, "mixed", tmp_path, "--ops", "8000", "--clients", "1", "--outcome", outcome],
                   check=True, env=env, timeout=120, capture_output=True)
    figures = json.loads(outcome.read_text())
    assert figures["operations"] == sum(figures["by_op"].values()) == 8000


# -- the timer ----------------------------------------------------------------------------

def test_the_timer_records_other_work_niced_beside_the_command(tmp_path):
    """A niced busy process beside the workload shows as niced CPU time in its outcome (on a
    shared machine, other people's builds and tests), and the CPU pressure is a share."""
    from traces.capture.recipes import timed

    busy = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c",
                             "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end: pass"])
    try:
        outcome = tmp_path / "outcome.json"
        assert timed.main([str(outcome), "--", sys.executable, "-c", "import time; time.sleep(1)"]) == 0
    finally:
        busy.kill()
        busy.wait()
    recorded = timed.outcome(timed.read(outcome))
    # One CPU-bound process for the whole second: most of a CPU-second, nowhere near two.
    assert 0.3 <= recorded["niced_cpu_s"] <= recorded["elapsed_s"] * os.cpu_count()
    assert recorded["cpu_pressure"] is None or 0 <= recorded["cpu_pressure"] <= 1
