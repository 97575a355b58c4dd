"""Beyond one machine, on one machine: a real Ray cluster on loopback (a head and more nodes
started by `ray.cluster_utils.Cluster`, each bound to 127.0.0.1, told apart by custom resources
host_a, host_b, ...) stands for the hosts. Library work as Ray tasks, and `replay run --plan`
with one actor per (host, target), each on its own node and loop device."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.cli_process import CLI, ENV, replay_cli, replay_process
from tests.traces.test_library_catalog import broken_volume, msr_volumes
from traces.schema import Op
from traces.trace import read_trace, write_trace

MIB = 1 << 20
NODE = dict(num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=80 * MIB)


@pytest.fixture(scope="module")
def ray_cluster():
    """Three Ray nodes on 127.0.0.1 (resources host_a, host_b, host_c), shut down however the
    module's tests end."""
    # Before Ray is imported: without it Ray turns 127.0.0.1 into the machine's outward address.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'tracereplay[cluster]'")
    from ray.cluster_utils import Cluster

    cluster = None
    try:
        cluster = Cluster(initialize_head=True, shutdown_at_exit=True,
                          head_node_args={**NODE, "num_cpus": 2, "include_dashboard": False,
                                          "resources": {"host_a": 1}})
        nodes = {"host_a": cluster.head_node}
        for name in ("host_b", "host_c"):
            nodes[name] = cluster.add_node(**NODE, resources={name: 1})
    except Exception as e:  # noqa: BLE001 - any reason Ray cannot start here is a skip, named
        if cluster is not None:
            cluster.shutdown()
        pytest.skip(f"a Ray cluster cannot start here: {type(e).__name__}: {e}")
    try:
        yield SimpleNamespace(address=cluster.address, cluster=cluster, nodes=nodes)
    finally:
        cluster.shutdown()


def test_the_cluster_listens_on_loopback_only(ray_cluster):
    assert ray_cluster.address.startswith("127.0.0.1:")
    pids = {str(p.process.pid) for node in ray_cluster.nodes.values()
            for infos in node.all_processes.values() for p in infos}
    listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines()
    ours = [line for line in listening if any(f"pid={pid}," in line for pid in pids)]
    assert ours, "found none of the cluster's listening sockets"
    for line in ours:
        local = line.split()[3]
        assert local.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:")), line


def test_import_and_ls_as_ray_tasks(ray_cluster, tmp_path):
    from traces.convert import import_trace

    inputs = msr_volumes(tmp_path, count=3)
    bad = broken_volume(tmp_path)
    out = tmp_path / "lib"
    out.mkdir()
    done = replay_cli("import", *inputs, bad, "-o", out, "--cluster", ray_cluster.address, timeout=300)
    assert done.returncode == 1, done.stderr
    assert f"{bad}: failed: {bad}: line 2" in done.stderr and "imported 3 of 4 files" in done.stdout
    for src in inputs:  # the same traces as a sequential import
        one, _ = import_trace([src], tmp_path / f"{src.stem}-seq.parquet")
        seq, par = read_trace(one), read_trace(out / f"{src.stem}.parquet")
        for name in seq[0]:
            np.testing.assert_array_equal(seq[0][name], par[0][name])
        seq[1]["source"].pop("command"), par[1]["source"].pop("command")
        assert seq[1] == par[1]
    # RAY_ADDRESS does what --cluster does.
    done = subprocess.run([*CLI, "traces", "ls", str(out)], capture_output=True, text=True, timeout=300,
                          env={**ENV, "RAY_ADDRESS": ray_cluster.address})
    assert done.returncode == 0, done.stderr
    assert sum(f"{out}/vol" in line for line in done.stdout.splitlines()) == 3


def _device_trace(path, devices=3, per_device=1500, gap_ns=300_000, span=16 * MIB):
    """Rows interleaved over `devices` device values, 4 KiB reads and writes; ts_ns unique."""
    n = devices * per_device
    i = np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(7)
    write_trace(path, {"ts_ns": i * gap_ns, "op": np.where(i % 4 == 0, Op.WRITE, Op.READ).astype(np.uint8),
                       "offset": rng.integers(0, span // 4096, n) * 4096,
                       "length": np.full(n, 4096, np.int64), "device": (i % devices).astype(np.uint32)},
                {"name": path.stem, "source": {"kind": "synth:test"}, "device_size": span})
    return path


def _plan(path, hosts):
    lines = []
    for h in hosts:
        lines.append("[[host]]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in h.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _summary_counts(summary):
    job = summary["jobs"][0]
    return {op: (job[op]["total_ios"], job[op]["io_bytes"]) for op in ("read", "write")}


@pytest.mark.root
@pytest.mark.loopdev
def test_three_hosts_replay_every_row_once_starting_together(ray_cluster, tmp_path, loop_device):
    trace = _device_trace(tmp_path / "vols.parquet")
    targets = [loop_device(32 * MIB) for _ in range(3)]
    plan = _plan(tmp_path / "plan.toml", [
        {"name": n, "resource": f"host_{n}", "target": t, "devices": [d]}
        for d, (n, t) in enumerate(zip("abc", targets))])
    out = tmp_path / "run"
    done = replay_cli("run", trace, "--cluster", ray_cluster.address, "--plan", plan, "-o", out,
                      timeout=300)
    assert done.returncode == 0, done.stderr
    record = json.loads((out / "cluster.json").read_text())
    assert not record["partial"] and record["failed_hosts"] == []
    hosts = {h["name"]: h for h in record["hosts"]}
    # Each host's actor ran on its own node.
    assert len({h["node"]["node_id"] for h in hosts.values()}) == 3
    # Every row of the trace replayed exactly once, on the host its device maps to.
    cols, _ = read_trace(trace)
    run = pq.read_table(out / "run.parquet").to_pydict()
    assert sorted(run["ts_ns"]) == cols["ts_ns"].tolist()
    assert all(r >= 0 for r in run["result"])
    for d, name in enumerate("abc"):
        host = pq.read_table(out / "hosts" / f"{name}.parquet").to_pydict()
        assert set(host["device"]) == {d} and len(host["ts_ns"]) == 1500 == hosts[name]["rows"]
    # They started together: the bound. Three engine threads spin for the start on
    # two cores here (7-314 us measured in 26 runs at load 1-2; once 6.3 ms at load 18).
    assert record["start_skew_ns"] <= 1_000_000
    meta = json.loads(pq.read_schema(out / "hosts" / "b.parquet").metadata[b"tracereplay"])
    assert meta["cluster"]["offset_ns"] == hosts["b"]["offset_ns"]
    # Not at the nice 15 Ray gives its workers: there every other process went first.
    assert meta["cluster"]["nice"] == 0
    # Host b's counts and bytes are those of a one-host replay of its share.
    share = tmp_path / "share-b.parquet"
    write_trace(share, {k: v[cols["device"] == 1] for k, v in cols.items()}, {"name": "share-b"})
    alone = replay_cli("run", share, targets[1], "-o", tmp_path / "alone.parquet", "--json", timeout=300)
    assert alone.returncode == 0, alone.stderr
    assert _summary_counts(json.loads(alone.stdout)) == _summary_counts(hosts["b"]["summary"])
    # compare reads the directory as one run.
    compared = replay_cli("compare", out, tmp_path / "alone.parquet", "--force", timeout=300)
    assert compared.returncode == 0, compared.stderr
    assert "cluster:a=" in compared.stdout


def test_two_hosts_start_within_a_millisecond(ray_cluster, tmp_path):
    trace = _device_trace(tmp_path / "t.parquet", devices=2, per_device=250, gap_ns=1_000_000)
    plan = _plan(tmp_path / "plan.toml", [{"name": "a", "resource": "host_a", "devices": [0]},
                                          {"name": "b", "resource": "host_b", "devices": [1]}])
    out = tmp_path / "run"
    done = replay_cli("run", trace, "--cluster", ray_cluster.address, "--plan", plan, "-o", out,
                      "--engine", "null", timeout=300)
    assert done.returncode == 0, done.stderr
    record = json.loads((out / "cluster.json").read_text())
    hosts = record["hosts"]
    # The measured skew (the spread of the hosts' first I/O lateness on their own clocks, after
    # the offsets), and on this one machine, one monotonic clock, the spread of the instants
    # they really started at, which the offsets' errors would widen.
    assert record["start_skew_ns"] <= 1_000_000
    started = [h["start_local_ns"] + h["first_late_ns"] for h in hosts]
    assert abs(started[0] - started[1]) <= 1_000_000
    assert all(abs(h["offset_ns"]) <= h["rtt_ns"] for h in hosts)
    assert "start skew" in done.stdout


def test_a_target_refused_on_one_host_starts_none(ray_cluster, tmp_path):
    trace = _device_trace(tmp_path / "vols.parquet", devices=2, per_device=50)
    good, small = tmp_path / "a.img", tmp_path / "b.img"
    good.write_bytes(b"")
    os.truncate(good, 32 * MIB)
    small.write_bytes(b"\0" * MIB)  # the trace spans 16 MiB
    before = good.stat().st_mtime_ns
    plan = _plan(tmp_path / "plan.toml", [
        {"name": "a", "resource": "host_a", "target": str(good), "devices": [0]},
        {"name": "b", "resource": "host_b", "target": str(small), "devices": [1]}])
    done = replay_cli("run", trace, "--cluster", ray_cluster.address, "--plan", plan, "-o",
                      tmp_path / "run", timeout=300)
    assert done.returncode == 2
    assert done.stderr.startswith("error: refused before any host started: b (") and len(done.stderr.splitlines()) == 1
    assert good.stat().st_mtime_ns == before and not (tmp_path / "run" / "hosts").exists()


def _started(proc, timeout=180):
    """Collect the driver's stderr in a thread; return once it says the hosts started."""
    lines, event = [], threading.Event()

    def read():
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("started "):
                event.set()

    threading.Thread(target=read, daemon=True).start()
    assert event.wait(timeout), "".join(lines)
    return lines


def test_ctrl_c_stops_every_host_and_keeps_their_rows(ray_cluster, tmp_path):
    trace = _device_trace(tmp_path / "long.parquet", devices=1, per_device=6000, gap_ns=2_000_000)
    plan = _plan(tmp_path / "plan.toml", [{"name": n, "resource": f"host_{n}"} for n in "abc"])
    out = tmp_path / "run"
    with replay_process("run", trace, "--cluster", ray_cluster.address, "--plan", plan, "-o", out,
                        "--engine", "null") as proc:
        _started(proc)
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=180)
    assert proc.returncode == 130
    record = json.loads((out / "cluster.json").read_text())
    assert record["interrupted"] and record["partial"] and record["failed_hosts"] == []
    total = 0
    for name in "abc":
        host = pq.read_table(out / "hosts" / f"{name}.parquet")
        meta = json.loads(host.schema.metadata[b"tracereplay"])
        assert 0 < host.num_rows < 2000 and meta["interrupted"]
        total += host.num_rows
    run = pq.read_table(out / "run.parquet", columns=["ts_ns"]).column("ts_ns").to_pylist()
    assert len(run) == total == len(set(run))
    assert json.loads(pq.read_schema(out / "run.parquet").metadata[b"tracereplay"])["interrupted"]


def test_a_node_that_dies_mid_run_is_named_and_the_others_kept(ray_cluster, tmp_path):
    doomed = ray_cluster.cluster.add_node(**NODE, resources={"host_d": 1})
    try:
        trace = _device_trace(tmp_path / "t.parquet", devices=1, per_device=2000, gap_ns=2_000_000)
        plan = _plan(tmp_path / "plan.toml", [{"name": "a", "resource": "host_a"},
                                              {"name": "d", "resource": "host_d"}])
        out = tmp_path / "run"
        with replay_process("run", trace, "--cluster", ray_cluster.address, "--plan", plan, "-o", out,
                            "--engine", "null") as proc:
            lines = _started(proc)
            time.sleep(1)
            ray_cluster.cluster.remove_node(doomed, allow_graceful=False)
            doomed = None
            proc.wait(timeout=180)
        assert proc.returncode == 1, "".join(lines)
        assert any(line.startswith("host d (127.0.0.1) died mid-run") for line in lines)
        record = json.loads((out / "cluster.json").read_text())
        assert record["failed_hosts"] == ["d"] and record["partial"]
        a = pq.read_table(out / "hosts" / "a.parquet")
        assert a.num_rows == 1000  # host a finished its share
        assert not (out / "hosts" / "d.parquet").exists()
        meta = json.loads(pq.read_schema(out / "run.parquet").metadata[b"tracereplay"])
        assert meta["interrupted"] and meta["cluster"]["failed_hosts"] == ["d"]
    finally:
        if doomed is not None:
            ray_cluster.cluster.remove_node(doomed)
        # What the dead host's actor had in its temporary directory (its share) is left on
        # that host; here that host is this machine.
        for leftover in Path(tempfile.gettempdir()).glob("tracereplay-d-*"):
            shutil.rmtree(leftover, ignore_errors=True)


@pytest.mark.parametrize("plan,message", [
    ('[[host]]\nname = "a"\ndevices = [0]\n[[host]]\nname = "b"\ndevices = [0]\n', "device 0 is given to both a and b"),
    ('[[host]]\nname = "a"\ndevices = [0]\n', "device(s) 1 of the trace are in no host's devices"),
    ('[[host]]\nname = "a"\nhost = "x"\n', "unknown keys host"),
    ("nothing = 1\n", "the plan lists no hosts"),
])
def test_a_bad_plan_is_one_line(tmp_path, plan, message):
    trace = _device_trace(tmp_path / "t.parquet", devices=2, per_device=10)
    (tmp_path / "plan.toml").write_text(plan)
    done = replay_cli("run", trace, "--cluster", "127.0.0.1:1", "--plan", tmp_path / "plan.toml")
    assert done.returncode == 2 and done.stderr.startswith("error: ") and message in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_cluster_options_need_each_other_and_a_reachable_head(tmp_path):
    done = replay_cli("run", "demo", "--plan", tmp_path / "p.toml", cwd=tmp_path)
    assert done.returncode == 2 and "needs both --cluster ADDRESS and --plan PLAN" in done.stderr
    _plan(tmp_path / "p.toml", [{"name": "a"}])
    done = replay_cli("run", "demo", "--plan", tmp_path / "p.toml", "--cluster", "127.0.0.1:1", cwd=tmp_path)
    assert done.returncode == 2 and "cannot reach the Ray cluster at 127.0.0.1:1" in done.stderr
