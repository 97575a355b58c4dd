"""The Ray a command starts or joins (replay.ray_session), real and on loopback only: `--cluster
local` listens on 127.0.0.1 alone and ends every process it started however the command ends;
the documented `ray start --head` + `--cluster` flow works with a token saved on the machine.
Each test marks the environment of what it starts, and finds every process by that mark."""
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.cli_process import CLI, ENV, replay_cli, replay_process
from tests.replay.test_cluster import _device_trace, _plan, _started
from tests.traces.test_library_catalog import msr_volumes

pytest.importorskip("ray", reason="Ray is not installed: pip install 'tracereplay[cluster]'")

LOOPBACK = ("127.0.0.1:", "[::ffff:127.0.0.1]:", "[::1]:")


def _stat(pid) -> list[str] | None:
    """The fields of /proc/PID/stat after the name (state, ppid, ...), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _tree(root) -> dict[int, tuple[str, str]]:
    """pid -> (name, start time) of every process below `root`, found by their parents."""
    children = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (fields := _stat(entry.name)):
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = {}, [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    found[pid] = (f.read().strip(), _stat(pid)[19])
            except (OSError, TypeError):
                continue
            todo.append(pid)
    return found


def _left(processes, within=20.0) -> dict[int, str]:
    """Those of `processes` (as _tree gives them) still running after `within` s: the same pid
    and start time, not a zombie."""
    def running():
        return {pid: name for pid, (name, start) in processes.items()
                if (fields := _stat(pid)) and fields[19] == start and fields[0] != "Z"}
    deadline = time.monotonic() + within
    while (left := running()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _kill(processes):
    for pid in _left(processes, within=0):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _args(pid) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _cmdline(pid) -> str:
    """The program a process runs (its first argument ending in .py, else its first)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")
    except OSError:
        return ""
    return next((a for a in args if a.endswith(".py")), args[0])


def _listening(pids) -> list[str]:
    """`ss` lines of the TCP and UDP sockets that `pids` listen on."""
    lines = subprocess.run(["ss", "-ltunpH"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in lines if any(f"pid={pid}," in line for pid in pids)]


@pytest.fixture
def started():
    """Record here what a test started (as _tree gives them): killed at the end if still there."""
    processes = {}
    yield processes
    _kill(processes)


def _long_run(tmp_path):
    """`replay run --cluster local --plan` of 12 s on the null engine, as a process."""
    trace = _device_trace(tmp_path / "long.parquet", devices=1, per_device=6000, gap_ns=2_000_000)
    plan = _plan(tmp_path / "plan.toml", [{"name": "a"}])
    return replay_process("run", trace, "--cluster", "local", "--plan", plan, "-o", tmp_path / "run",
                          "--engine", "null")


def test_a_local_cluster_listens_on_loopback_only_and_serves_no_dashboard(tmp_path, started):
    with _long_run(tmp_path) as proc:
        _started(proc)
        seen = set()
        for _ in range(10):  # while the hosts replay: every process has started by then
            started.update(_tree(proc.pid))
            seen.update(_listening(started))
            time.sleep(0.3)
        dashboard = [pid for pid in started if _cmdline(pid).endswith("dashboard/dashboard.py")]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    names = {line.split('(("')[1].split('"')[0] for line in seen}
    assert {"gcs_server", "raylet"} <= names, seen
    for line in seen:
        assert line.split()[4].startswith(LOOPBACK), line
    # Ray's head still runs its API process, headless: it listens on nothing.
    assert dashboard
    assert all(f"pid={pid}," not in line for pid in dashboard for line in seen)
    assert proc.returncode == 130


def _running_replay(proc, started):
    """Once the hosts replay: record every process below the command, the node's agents among them."""
    _started(proc)
    deadline = time.monotonic() + 30
    while not {"raylet", "ray::HostActor", "ray::DashboardA", "ray::RuntimeEnv"} <= {
            name for name, _ in started.values()}:
        assert time.monotonic() < deadline, started
        started.update(_tree(proc.pid))
        time.sleep(0.2)


def test_ctrl_c_ends_every_process_the_local_cluster_started(tmp_path, started):
    with _long_run(tmp_path) as proc:
        _running_replay(proc, started)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    assert proc.returncode == 130
    assert _left(started) == {}


def test_a_driver_killed_outright_leaves_no_ray_process(tmp_path, started):
    # SIGKILL stands for Ray aborting the driver (a failed check after a cancel once did):
    # no code of the driver runs, and the node's agents were left running for good.
    with _long_run(tmp_path) as proc:
        _running_replay(proc, started)
        keeper = next(pid for pid in started if any("_keep()" in a for a in _args(pid)))
        files = Path(_args(keeper)[-1])  # the cluster's temporary directory
        assert files.is_dir()
        proc.kill()
        proc.wait()
    assert _left(started) == {}
    assert not files.exists()


def test_the_documented_ray_start_flow_joins_with_a_saved_token(tmp_path, started):
    """`ray start --head` turns token authentication on where a token is saved (any earlier
    ray.init() saves one); a driver given the address must then send it."""
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(uuid.uuid4().hex * 2)
    lib = tmp_path / "lib"
    lib.mkdir()
    done = replay_cli("import", *msr_volumes(tmp_path, count=2, rows=200), "-o", lib, "--jobs", "1")
    assert done.returncode == 0, done.stderr
    # Ray's files under a short directory: its socket paths must fit 107 bytes.
    raytmp = tempfile.mkdtemp(prefix="tr-ray-")
    env = {**ENV, "HOME": str(home), "RAY_TMPDIR": raytmp, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_AUTH_MODE", None)
    with socket.socket() as s:  # a free port for the head
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    head = subprocess.Popen([os.path.join(os.path.dirname(CLI[0]), "ray"), "start", "--head", "--block",
                             f"--port={port}", "--node-ip-address=127.0.0.1", "--include-dashboard=false",
                             "--num-cpus=1", "--disable-usage-stats"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    started[head.pid] = ("ray", _stat(head.pid)[19])
    try:
        deadline = time.monotonic() + 120
        while subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True).stdout == "":
            assert head.poll() is None and time.monotonic() < deadline, "the head did not start"
            time.sleep(0.2)
        for k, address in enumerate((f"127.0.0.1:{port}", "auto")):
            done = subprocess.run([*CLI, "traces", "catalog", str(lib), "--cluster", address, "-o",
                                   str(tmp_path / f"catalog{k}.parquet")],
                                  capture_output=True, text=True, env=env, timeout=240)
            started.update(_tree(head.pid))
            assert done.returncode == 0, (address, done.stderr[-2000:])
            assert "cataloged 2 traces" in done.stdout
        for line in _listening(started):
            assert line.split()[4].startswith(LOOPBACK), line
    finally:
        started.update(_tree(head.pid))
        head.terminate()  # `ray start --block` ends its processes on SIGTERM
        head.wait(timeout=60)
        _left(started, within=10)
        shutil.rmtree(raytmp, ignore_errors=True)


def test_cluster_auto_without_a_cluster_here_is_one_line(tmp_path):
    done = subprocess.run([*CLI, "traces", "ls", "--cluster", "auto"], capture_output=True, text=True,
                          env={**ENV, "RAY_TMPDIR": str(tmp_path)}, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == ("error: --cluster auto: no Ray cluster was started on this machine; "
                                   "start one with `ray start --head --node-ip-address=127.0.0.1`, or give "
                                   "--cluster local for one that lasts as long as the command")
