"""The replayer's own time per hop of a causal chain, measured on the target.

A capture times each I/O at the block layer, so an application's think time runs from one
I/O completing at the device to its next reaching the device, and holds the application's own
reaping and submission. A causal replay adds the replayer's on top: the engine sees the
parent's completion some time after the device, and its next I/O reaches the device some time
into the system call that submits it (on io_uring, a flush goes through a kernel worker
thread first). To take that off, a short chain of probe I/Os, each issued as the one before
completes, is replayed on the target with causal timing while the target is traced as a
capture traces it: each gap between one probe completing and the next one reaching the device
is the replayer's own time for that pair of ops.
"""
import os
import signal
import sys

import numpy as np

from traces import workdirs
from traces.schema import Op

# Every ordered pair of read, write and flush once, read cyclically: RR RW WW WF FF FR RF FW WR.
PATTERN = (Op.READ, Op.READ, Op.WRITE, Op.WRITE, Op.FLUSH, Op.FLUSH, Op.READ, Op.FLUSH, Op.WRITE)
REPEATS = 40  # 360 probes; the first pass of the pattern warms up and is left out
PROBE_BYTES = 4096
SPAN = 1 << 21  # the probes read and write the target's first 2 MiB
STEP_NS = 10_000


def probe_columns(repeats: int = REPEATS) -> dict:
    """The probe trace: one process whose every I/O is issued as its previous one completes
    (think time 0), so causal timing chains each probe to the one before."""
    op = np.tile(np.array(PATTERN, np.uint8), repeats)
    n = len(op)
    row = np.arange(n, dtype=np.int64)
    data = op != Op.FLUSH
    return {"ts_ns": row * STEP_NS, "op": op,
            "offset": np.where(data, row * PROBE_BYTES % SPAN, 0).astype(np.int64),
            "length": np.where(data, PROBE_BYTES, 0).astype(np.int64),
            "latency_ns": np.full(n, STEP_NS, np.int64), "pid": np.ones(n, np.int32)}


def pair_costs(ts_ns: np.ndarray, op: np.ndarray, latency_ns: np.ndarray, skip: int = len(PATTERN)) -> np.ndarray:
    """From the block trace of a probe chain (its rows in issue order): the median gap between
    an op `a` completing and the next op `b` reaching the device, as host[a, b] in ns (0 where
    the pair was not seen). A discard is costed as a write."""
    gap = ts_ns[1:] - (ts_ns[:-1] + latency_ns[:-1])
    a, b = op[:-1].astype(np.int64), op[1:].astype(np.int64)
    keep = np.arange(len(gap)) >= skip
    host = np.zeros((4, 4), np.int64)
    for x in (Op.READ, Op.WRITE, Op.FLUSH):
        for y in (Op.READ, Op.WRITE, Op.FLUSH):
            sel = keep & (a == x) & (b == y)
            if sel.any():
                host[x, y] = max(0, int(np.median(gap[sel])))
    host[Op.DISCARD, :] = host[Op.WRITE, :]
    host[:, Op.DISCARD] = host[:, Op.WRITE]
    return host


def host_costs(target: str, engine: str | None, notices: list) -> np.ndarray | None:
    """host[a, b], the replayer's own ns between an op `a` completing and an op `b` that waited
    for it reaching the device, measured on the block device `target` (its first 2 MiB are
    overwritten); None, with a notice, where it cannot be measured."""
    from replay.signals import Interrupted
    from traces.errors import ReplayError
    from traces.capture import capture
    from traces.trace import read_trace, write_trace

    def give_up(why):
        notices.append(f"causal timing: the replayer's own time per I/O could not be measured on {target} "
                       f"({why}); think times are replayed as captured")

    # Owned: a run killed outright mid-calibration leaves it; the next run removes it.
    with workdirs.owned("tracereplay-calibrate-") as tmp:
        probe = probe_columns()
        write_trace(tmp / "probe.parquet", probe, {"name": "probe", "source": {"kind": "synth:calibrate"}})
        run = [sys.executable, "-c", "from replay.cli import main; main()", "run", str(tmp / "probe.parquet"),
               target, "--timing", "causal", "--no-calibrate", "--destroy-data", "-o", str(tmp / "r.parquet"),
               *(["--engine", engine] if engine else [])]
        log = tmp / "probe.log"
        try:
            done = capture(target, tmp / "seen.parquet", notices=[],
                           command=["sh", "-c", 'exec "$@" >"$0" 2>&1', str(log), *run])
        except (OSError, ReplayError) as e:
            give_up(e)
            return None
        if done.interrupted:  # the capture caught the stop signal: pass it on, with its exit status
            raise Interrupted(done.signal or signal.SIGINT)
        if done.command_status != 0:
            give_up((log.read_text().strip().splitlines() or ["the probe replay failed"])[-1])
            return None
        seen, _ = read_trace(tmp / "seen.parquet")
    order = np.argsort(seen["ts_ns"], kind="stable")
    ops, ts, lat = seen["op"][order], seen["ts_ns"][order], seen["latency_ns"][order]
    if not np.array_equal(ops, probe["op"]) or (lat < 0).any():
        give_up(f"its {len(probe['op'])} probes reached the device as {len(ops)} requests")
        return None
    host = pair_costs(ts, ops, lat)
    notices.append(f"causal timing: the replayer's own time per I/O on {target}, taken off each think time: "
                   f"read after read {host[Op.READ, Op.READ] / 1e3:.0f} us, write after write "
                   f"{host[Op.WRITE, Op.WRITE] / 1e3:.0f} us, flush after write {host[Op.WRITE, Op.FLUSH] / 1e3:.0f} us, "
                   f"write after flush {host[Op.FLUSH, Op.WRITE] / 1e3:.0f} us")
    return host


def can_calibrate(kind: str) -> bool:
    """A block device can be traced at the block layer by root; a file shares its device."""
    return kind == "block" and os.geteuid() == 0


def for_run(target, engine: str | None, writes: bool, notices: list) -> np.ndarray | None:
    """For a causal replay on `target` (traces.targets.Target): the replayer's own time per
    I/O there, measured before the run opens it; None, with a notice saying why, where it
    cannot be."""
    if engine == "null":
        return None
    if not writes:
        notices.append("causal timing: this trace does not write, so the replayer's own time per I/O is "
                       "not measured on the target (its probes write); think times are replayed as captured")
        return None
    if not can_calibrate(target.kind):
        notices.append("causal timing: the replayer's own time per I/O is measured on a block device, as "
                       "root; here each think time is replayed as captured, with the replayer's own "
                       "submission added to it")
        return None
    return host_costs(target.path, engine, notices)
