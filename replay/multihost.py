"""One replay on several hosts of a Ray cluster: a plan maps the trace's device values (or
shares of its rows) to (host, target) pairs; one Ray actor per pair runs today's runner
(replay.runner.replay) in a child process, all starting at one instant.

The start: the driver measures each actor's clock offset over several round trips (NTP
style: the actor's clock against the midpoint of the driver's send and receive, keeping the
round trip with the least delay), picks an instant shortly ahead on its own monotonic clock,
and each actor starts at that instant translated to its own monotonic clock. Offsets and
round trips are recorded in each host's results, and with the start skew in
DIR/cluster.json and DIR/run.parquet.

The results: DIR/hosts/HOST.parquet per host, as `replay run` writes them, and DIR/run.parquet,
every host's rows in one results file (what compare, report and verdict read as one run).
"""
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from traces.errors import ReplayError

# How far ahead of the last clock measurement the driver puts the start: room for each
# host's child process to open its target and start its engine after it is told the instant.
START_LEAD_S = 1.0
CLOCK_ROUNDS = 8
# How long a stopped host (Ctrl-C) has to write its results before it is given up on.
STOP_WAIT_S = 60.0
RUN_FILE = "run.parquet"
CLUSTER_FILE = "cluster.json"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class HostPlan:
    """One (host, target) of a plan: where its actor runs, what it replays, on what."""

    name: str
    resource: str | None = None  # a custom resource only that node has (ray start --resources)
    node_ip: str | None = None  # or the node with this address
    target: str | None = None  # a path on that host; None: a scratch file there
    devices: list[int] | None = None  # the trace's device values it replays; None: a share


@dataclass
class HostOutcome:
    name: str
    node: dict = field(default_factory=dict)
    offset_ns: int | None = None  # host clock - driver clock
    rtt_ns: int | None = None  # the round trip the offset was taken from
    start_local_ns: int | None = None  # the start on the host's monotonic clock
    first_late_ns: int | None = None  # first I/O's issue - intended: how late the host started
    rows: int = 0
    rows_planned: int = 0
    interrupted: bool = False
    error: str | None = None  # why the host failed (died, refused)
    notices: list = field(default_factory=list)
    summary: dict | None = None
    file: str | None = None


def load_plan(path) -> list[HostPlan]:
    """Read a plan (TOML or JSON): a list of hosts, `[[host]]` tables in TOML or
    {"host": [...]} in JSON, each with name, resource or node_ip, target, devices."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ReplayError(f"cannot read the plan {path}: {e.strerror or e}") from None
    try:
        if path.suffix == ".json":
            doc = json.loads(text)
        else:
            import tomllib

            doc = tomllib.loads(text)
    except (ValueError, json.JSONDecodeError) as e:
        raise ReplayError(f"{path}: not a valid plan ({e}); see the example plan in docs/cluster.md") from None
    hosts = doc.get("host") if isinstance(doc, dict) else None
    if not isinstance(hosts, list) or not hosts:
        raise ReplayError(f"{path}: the plan lists no hosts; give one [[host]] table per (host, target)")
    plans, names = [], set()
    known = {"name", "resource", "node_ip", "target", "devices"}
    for i, h in enumerate(hosts):
        where = f"{path}: host {i + 1}"
        if not isinstance(h, dict):
            raise ReplayError(f"{where} is not a table")
        unknown = set(h) - known
        if unknown:
            raise ReplayError(f"{where} has unknown keys {', '.join(sorted(unknown))}; "
                              f"a host takes {', '.join(sorted(known))}")
        name = h.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ReplayError(f"{where} needs a name of letters, digits, '.', '_' or '-' (it names its results file)")
        if name in names:
            raise ReplayError(f"{path}: two hosts are named {name!r}")
        names.add(name)
        devices = h.get("devices")
        if devices is not None and (not isinstance(devices, list) or not devices
                                    or not all(isinstance(d, int) and not isinstance(d, bool) for d in devices)):
            raise ReplayError(f"{where} ({name}): devices must be a list of the trace's device numbers")
        for key in ("resource", "node_ip", "target"):
            if h.get(key) is not None and not isinstance(h[key], str):
                raise ReplayError(f"{where} ({name}): {key} must be a string")
        plans.append(HostPlan(name, h.get("resource"), h.get("node_ip"), h.get("target"), devices))
    with_devices = [p for p in plans if p.devices is not None]
    if with_devices and len(with_devices) != len(plans):
        raise ReplayError(f"{path}: give devices for every host or for none (then row i goes to "
                          "host i mod the number of hosts)")
    seen = {}
    for p in with_devices:
        for d in p.devices:
            if d in seen:
                raise ReplayError(f"{path}: device {d} is given to both {seen[d]} and {p.name}")
            seen[d] = p.name
    return plans


def split_trace(trace_path, plans: list[HostPlan]) -> tuple[dict, list[dict]]:
    """The trace's metadata and each host's share of its columns (with `row`, each row's
    index in the trace): by device value, or row i to host i mod N."""
    from traces.trace import read_trace

    columns, metadata = read_trace(trace_path)
    n = len(columns["ts_ns"])
    rows = np.arange(n, dtype=np.int64)
    if plans[0].devices is not None:
        if "device" not in columns:
            raise ReplayError(f"{trace_path}: the plan gives hosts devices, but the trace has no "
                              "device column; leave devices out to deal rows to the hosts")
        device = columns["device"]
        given = {d for p in plans for d in p.devices}
        present = set(np.unique(device).tolist())
        if present - given:
            raise ReplayError(f"{trace_path}: device(s) {', '.join(map(str, sorted(present - given)))} "
                              "of the trace are in no host's devices; every row must be replayed")
        masks = [np.isin(device, p.devices) for p in plans]
    else:
        masks = [rows % len(plans) == k for k in range(len(plans))]
    return metadata, [{name: col[m] for name, col in {**columns, "row": rows}.items()} for m in masks]


def _share_file(columns: dict, metadata: dict, path: Path, host: str) -> Path:
    from traces.trace import write_trace

    share = {k: v for k, v in columns.items() if k != "row"}
    meta = {**metadata, "name": metadata.get("name", "trace"), "share": {"host": host}}
    return write_trace(path, share, meta)


# ---- the host side: an actor and the child process it runs ----------------------------------

class HostActor:
    """Runs on one host: takes its share, checks its target, runs the replay in a child process
    (the runner as `replay run` uses it, with its Ctrl-C handling) and hands the results back."""

    def __init__(self, name: str):
        self.name = name
        self.dir = Path(tempfile.mkdtemp(prefix=f"tracereplay-{name}-"))
        self.share = self.dir / "share.parquet"
        self.output = self.dir / "results.parquet"
        self.proc = None

    def node(self) -> dict:
        import platform

        import ray

        return {"hostname": platform.node(), "node_id": ray.get_runtime_context().get_node_id(),
                "ip": ray.util.get_node_ip_address(), "pid": os.getpid(), "workdir": str(self.dir)}

    def clock(self) -> int:
        return time.monotonic_ns()

    def load(self, share: bytes) -> int:
        self.share.write_bytes(share)
        return len(share)

    def check(self, target, options: dict):
        """The target checks of `replay run --dry-run` (in use, size, mapping): None when the
        target may be replayed on, else the reason."""
        from replay.runner import RunOptions, replay

        try:
            replay(str(self.share), target, RunOptions(**{**options, "dry_run": True}))
        except ReplayError as e:
            return str(e)
        return None

    def prepare(self, target, options: dict, metadata: dict) -> str:
        """Start the child: it reads the share and waits for its start instant."""
        spec = self.dir / "spec.json"
        spec.write_text(json.dumps({"share": str(self.share), "target": target, "options": options,
                                    "output": str(self.output), "metadata": metadata}))
        self.proc = subprocess.Popen([sys.executable, "-m", "replay.multihost", str(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     preexec_fn=_prepare_child, cwd=self.dir)
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.proc.wait()
            return f"the replay process did not start (exit {self.proc.returncode}): {line}"
        return "ready"

    def start(self, start_ns: int, clock: dict) -> None:
        self.proc.stdin.write(json.dumps({"start_ns": start_ns, "clock": clock}) + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def wait(self) -> dict:
        """Wait for the replay to end; its outcome, with the results file's bytes."""
        out = self.proc.stdout.read()
        self.proc.wait()
        lines = [line for line in out.splitlines() if line.startswith("{")]
        outcome = json.loads(lines[-1]) if lines else {"error": f"the replay process exited {self.proc.returncode}"}
        if self.output.is_file():
            outcome["results"] = self.output.read_bytes()
        return outcome

    def cleanup(self) -> None:
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


def _prepare_child():
    """In the child, before exec: end with the actor's process (a host that dies takes its
    replay with it, and nothing is left writing to its target), take SIGINT as Ctrl-C (a Ray
    worker's threads block it, and a blocked or ignored signal stays so across exec), and
    run at nice 0: Ray starts its workers at nice 15, and a replay left there yields the CPU
    to every other process on the host, Ray's own included."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    with contextlib.suppress(PermissionError):  # lowering it needs root or RLIMIT_NICE
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def _child(spec_path) -> int:
    """The host's replay process: read the share, say ready, wait for the start instant on
    stdin, replay with the runner, print the outcome as JSON. Ctrl-C (SIGINT from the actor's
    stop) keeps the rows done, marked interrupted, as in `replay run`."""
    from replay.runner import RunOptions, TraceSource, replay

    from analysis.summary import warm_up

    spec = json.loads(Path(spec_path).read_text())
    source = TraceSource(spec["share"])
    warm_up()  # the summary's kernels compiled now, not after the start instant
    print("ready", flush=True)
    line = sys.stdin.readline().strip()
    if not line.startswith("{"):
        return 130  # the driver gave up before the start
    start = json.loads(line)
    start_ns = int(start["start_ns"])
    metadata = spec["metadata"]
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    metadata["cluster"] = {**metadata.get("cluster", {}), **start["clock"], "start_local_ns": start_ns,
                           "nice": nice}
    notices = []
    if nice > 0:
        notices.append(f"this host replays at nice {nice}, as Ray started its worker (lowering it needs root "
                       "or a higher RLIMIT_NICE): other processes on the host go first, and lateness grows")
    try:
        outcome = replay(source, spec["target"], RunOptions(**spec["options"], start_ns=start_ns),
                         output=spec["output"], notices=notices, metadata=metadata)
    except ReplayError as e:
        print(json.dumps({"error": str(e), "notices": notices}), flush=True)
        return 1
    first_late = None
    if outcome.rows:
        import pyarrow.parquet as pq

        first = pq.ParquetFile(outcome.output).read_row_group(0, columns=["intended_ns", "issue_ns"])
        first_late = int(first["issue_ns"][0].as_py()) - int(first["intended_ns"][0].as_py())
    print(json.dumps({"rows": outcome.rows, "interrupted": outcome.interrupted, "notices": notices,
                      "start_local_ns": start_ns, "first_late_ns": first_late,
                      "summary": outcome.summary.to_dict()}), flush=True)
    return 130 if outcome.interrupted else 0


# ---- the driver ----------------------------------------------------------------------------

def _measure_offset(ray, actor, rounds=CLOCK_ROUNDS) -> tuple[int, int]:
    """(offset, round trip) in ns: the host's clock minus the driver's, taken from the
    round trip with the least delay, whose midpoint is closest to when the host read its clock."""
    best = None
    for _ in range(rounds):
        t0 = time.monotonic_ns()
        remote = ray.get(actor.clock.remote())
        t1 = time.monotonic_ns()
        if best is None or t1 - t0 < best[1]:
            best = (remote - (t0 + t1) // 2, t1 - t0)
    return best


def _placement(plan: HostPlan) -> dict:
    if plan.resource:
        return {"resources": {plan.resource: 0.001}}
    if plan.node_ip:
        return {"resources": {f"node:{plan.node_ip}": 0.001}}
    return {}


def run_cluster(trace, plan_path, address, options, output_dir, echo=print) -> dict:
    """Replay `trace` on the hosts of `plan_path` through the Ray cluster at `address`;
    results go to `output_dir`. Returns the run's record (also DIR/cluster.json). Raises
    ReplayError before anything is issued when the plan, the trace or any host's target is
    refused; a host that fails mid-run is named in the record, the others' results kept."""
    from replay.ray_session import ray_session
    from traces import library

    plans = load_plan(plan_path)
    trace_path = library.resolve(trace)
    output_dir = Path(output_dir)
    if output_dir.exists() and any(output_dir.iterdir()):
        raise ReplayError(f"{output_dir} is not empty; give a new directory for the run's results")
    metadata, shares = split_trace(trace_path, plans)
    with ray_session(address) as ray:
        return _on_cluster(ray, plans, shares, metadata, trace_path, options, output_dir, address, echo)


def _on_cluster(ray, plans, shares, metadata, trace_path, options, output_dir, address, echo) -> dict:
    nodes = ray.cluster_resources()
    for p in plans:
        needed = next(iter(_placement(p).get("resources", {})), None)
        if needed and needed not in nodes:
            raise ReplayError(f"host {p.name}: no node of the cluster has {needed!r}; start that "
                              f"node with `ray start --address ... --resources '{{\"{needed}\": 1}}'`")
    run_options = asdict(options)
    run_options.pop("start_ns", None)
    remote = ray.remote(HostActor)
    actors = [remote.options(num_cpus=0, max_concurrency=4, max_restarts=0, **_placement(p)).remote(p.name)
              for p in plans]
    outcomes = [HostOutcome(p.name, rows_planned=len(s["ts_ns"])) for p, s in zip(plans, shares)]
    try:
        return _drive(ray, plans, actors, outcomes, shares, metadata, trace_path, run_options,
                      output_dir, address, echo)
    finally:
        for a in actors:
            try:
                ray.get(a.cleanup.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - a dead host has nothing left to clean
                pass
            ray.kill(a)


def _drive(ray, plans, actors, outcomes, shares, metadata, trace_path, run_options, output_dir,
           address, echo):
    with tempfile.TemporaryDirectory(prefix="tracereplay-shares-") as tmp:
        loads = []
        for p, a, s in zip(plans, actors, shares):
            path = _share_file(s, metadata, Path(tmp) / f"{p.name}.parquet", p.name)
            loads.append(a.load.remote(path.read_bytes()))
        ray.get(loads)
    for o, a in zip(outcomes, actors):
        o.node = ray.get(a.node.remote())
    # Safety: every host checks its own target before any host starts.
    refusals = ray.get([a.check.remote(p.target, run_options) for p, a in zip(plans, actors)])
    refused = [f"{p.name} ({p.target or 'scratch file'}): {r}" for p, r in zip(plans, refusals) if r]
    if refused:
        raise ReplayError("refused before any host started: " + "; ".join(refused))
    cluster_meta = {"address": address, "hosts": [p.name for p in plans]}
    prepared = ray.get([a.prepare.remote(p.target, run_options,
                                         {"cluster": {**cluster_meta, "host": p.name}})
                        for p, a in zip(plans, actors)])
    failed = [f"{p.name}: {r}" for p, r in zip(plans, prepared) if r != "ready"]
    if failed:
        raise ReplayError("a host could not start its replay: " + "; ".join(failed))
    for o, a in zip(outcomes, actors):
        o.offset_ns, o.rtt_ns = _measure_offset(ray, a)
    start_ns = time.monotonic_ns() + int(START_LEAD_S * 1e9)
    for o, a in zip(outcomes, actors):
        o.start_local_ns = start_ns + o.offset_ns
    ray.get([a.start.remote(o.start_local_ns, {"offset_ns": o.offset_ns, "rtt_ns": o.rtt_ns,
                                                "start_driver_ns": start_ns})
             for o, a in zip(outcomes, actors)])
    echo(f"started {len(actors)} hosts together at +{START_LEAD_S:.1f} s "
         f"(clock offsets {', '.join(f'{o.name} {o.offset_ns / 1e3:+.0f} us' for o in outcomes)})")
    interrupted = _collect(ray, actors, outcomes, output_dir, echo)
    return _record(outcomes, plans, shares, metadata, trace_path, output_dir, start_ns, interrupted, address)


def _collect(ray, actors, outcomes, output_dir, echo) -> bool:
    """Wait for every host; on Ctrl-C stop them all and still take what each did."""
    refs = {a.wait.remote(): i for i, a in enumerate(actors)}
    pending, interrupted, deadline = list(refs), False, None
    (output_dir / "hosts").mkdir(parents=True, exist_ok=True)
    while pending:
        try:
            if deadline is not None and time.monotonic() > deadline:
                break
            # Short waits: Ctrl-C reaches Python only between them (ray.wait blocks in C++).
            ready, pending = ray.wait(pending, num_returns=1, timeout=0.2)
        except KeyboardInterrupt:
            if interrupted:
                break  # a second Ctrl-C: stop waiting
            interrupted, deadline = True, time.monotonic() + STOP_WAIT_S
            echo("interrupted: stopping every host; their rows so far are kept")
            for a in actors:
                a.stop.remote()
            continue
        for ref in ready:
            o = outcomes[refs[ref]]
            try:
                got = ray.get(ref)
            except ray.exceptions.RayError as e:
                o.error = (f"host {o.name} ({o.node.get('ip', '?')}) died mid-run: "
                           f"{str(e).strip().splitlines()[0]}; the rows it journaled may be left in "
                           f"{o.node.get('workdir', 'its temporary directory')} on that host "
                           "(`replay recover` turns the .partial file there into results)")
                echo(o.error)
                continue
            o.notices = got.get("notices", [])
            if got.get("error"):
                o.error = f"host {o.name}: {got['error']}"
            o.rows, o.interrupted = got.get("rows", 0), bool(got.get("interrupted"))
            o.first_late_ns, o.summary = got.get("first_late_ns"), got.get("summary")
            if got.get("results"):
                path = output_dir / "hosts" / f"{o.name}.parquet"
                path.write_bytes(got["results"])
                o.file = str(path.relative_to(output_dir))
    for ref in pending:
        o = outcomes[refs[ref]]
        o.error = o.error or f"host {o.name} did not hand back its results within {STOP_WAIT_S:.0f} s of the stop"
    return interrupted


def _record(outcomes, plans, shares, metadata, trace_path, output_dir, start_ns, interrupted, address):
    """Write DIR/run.parquet (every host's rows) and DIR/cluster.json; return the record."""
    late = [o.first_late_ns for o in outcomes if o.first_late_ns is not None]
    skew = (max(late) - min(late)) if len(late) > 1 else 0
    uncertainty = max((o.rtt_ns or 0) // 2 for o in outcomes)
    partial = interrupted or any(o.error or o.interrupted for o in outcomes)
    record = {
        "format": "tracereplay-cluster-run", "version": 1,
        "trace": str(trace_path), "name": metadata.get("name", Path(trace_path).stem), "address": address,
        "start_driver_ns": start_ns, "start_lead_s": START_LEAD_S,
        "start_skew_ns": skew, "offset_uncertainty_ns": uncertainty,
        "interrupted": interrupted, "partial": partial,
        "failed_hosts": [o.name for o in outcomes if o.error],
        "hosts": [{**asdict(o), **asdict(p)} for o, p in zip(outcomes, plans)],
    }
    whole = _merge(outcomes, plans, output_dir, record)
    record["summary"] = whole
    record["run_file"] = RUN_FILE if whole is not None else None
    (output_dir / CLUSTER_FILE).write_text(json.dumps(record, indent=2, default=str))
    return record


def _merge(outcomes, plans, output_dir, record):
    """Every host's results rows in one results file, ordered by intended time; its summary."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from analysis.summary import RunSummary
    from traces.trace import TraceWriter, open_trace

    files = [(o, output_dir / o.file) for o in outcomes if o.file]
    if not files:
        return None
    tables = [pq.read_table(f) for _, f in files]
    common = [n for n in tables[0].column_names if all(n in t.column_names for t in tables)]
    table = pa.concat_tables([t.select(common) for t in tables])
    table = table.take(pa.array(np.argsort(table["intended_ns"].to_numpy(), kind="stable")))
    first = open_trace(files[0][1]).metadata
    targets = {o.name: (open_trace(f).metadata.get("target") or {}).get("path") for o, f in files}
    metadata = {**first, "target": {"path": "cluster:" + ",".join(f"{h}={t}" for h, t in targets.items()),
                                    "kind": "cluster", "hosts": targets},
                "cluster": {k: v for k, v in record.items() if k not in ("hosts",)},
                "interrupted": record["partial"]}
    metadata["cluster"]["hosts"] = [{k: h[k] for k in ("name", "offset_ns", "rtt_ns", "rows", "rows_planned",
                                                       "interrupted", "error", "file")} for h in record["hosts"]]
    fields = [(f.name, f.type) for f in table.schema]
    summary = RunSummary(jobname=str(metadata.get("name") or "tracereplay"))
    writer = TraceWriter(output_dir / RUN_FILE, fields, {k: v for k, v in metadata.items() if k != "summary"},
                         compression="lz4")
    for batch in table.to_batches(max_chunksize=1 << 19):
        chunk = {n: batch.column(i).to_numpy(zero_copy_only=False) for i, n in enumerate(batch.schema.names)}
        writer.write(chunk)
        summary.add(chunk)
    writer.close({"summary": summary.to_dict(), "rows_done": table.num_rows, "interrupted": record["partial"]})
    return summary.to_dict()


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
