"""`capture`: trace one block device while a command runs (or for a time, or until Ctrl-C).

Backends: tracefs (a private instance reading raw block events; works under kernel
lockdown) and blktrace (where it can open its relay files). Lost events are counted,
stored in the trace's metadata and, with strict=True, an error.
"""
import datetime
import os
import platform
import select
import shlex
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from traces import schema
from traces.capture import blktrace as blktrace_backend
from traces.capture.records import build, sleeps
from traces.capture.tracefs import CaptureError, TracefsSession
from traces.outputs import NO_ROOM, check_output
from traces.trace import MAX_ROW_GROUP_ROWS, TraceWriter
from traces.units import YEAR_S

__all__ = ["CaptureError", "CaptureResult", "capture", "device_info", "recipes"]

BACKENDS = ("auto", "tracefs", "blktrace")
# A command that ignores SIGTERM this long after Ctrl-C is killed.
_TERM_GRACE_S = 5.0
# How often the wait looks at a caller's `stop` event.
_STOP_POLL_S = 0.05


@dataclass
class CaptureResult:
    output: Path | None
    rows: int
    backend: str
    lost_events: int
    metadata: dict
    interrupted: bool = False
    command_status: int | None = None
    notices: list = field(default_factory=list)
    signal: int | None = None  # the signal that interrupted it (SIGINT, SIGTERM, SIGHUP)


def device_info(device: str) -> dict:
    """Facts about a block device from sysfs: dev_t of its whole disk, size, block size, model."""
    try:
        st = os.stat(device)
    except OSError as exc:
        raise CaptureError(f"{device}: {exc.strerror}; give a block device such as /dev/sdb") from None
    if not stat.S_ISBLK(st.st_mode):
        raise CaptureError(f"{device}: not a block device; capture traces a block device such as /dev/sdb")
    major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    sysdir = Path(f"/sys/dev/block/{major}:{minor}").resolve()
    info = {"path": str(device), "major": major, "minor": minor}
    if (sysdir / "partition").exists():
        # Request events name the whole disk; offsets in the trace are the disk's.
        disk = sysdir.parent
        major, minor = (int(x) for x in (disk / "dev").read_text().split(":"))
        info.update(partition=sysdir.name, disk=disk.name, major=major, minor=minor)
        sysdir = disk

    def read(rel, conv=str):
        try:
            return conv((sysdir / rel).read_text().strip())
        except (OSError, ValueError):
            return None

    info["name"] = sysdir.name
    info["size"] = (read("size", int) or 0) * 512
    if not info["size"]:
        what = " (a loop device with no file attached)" if sysdir.name.startswith("loop") else ""
        raise CaptureError(f"{device} has size 0{what}: it can take no I/O to trace; attach or "
                           "insert its medium first, or give another device")
    info["logical_block_size"] = read("queue/logical_block_size", int)
    info["model"] = read("device/model") or ("loop" if sysdir.name.startswith("loop") else None)
    backing = read("loop/backing_file")
    if backing:
        info["loop_backing_file"] = backing
        info["loop_direct_io"] = read("loop/dio") == "1"
    blkid = subprocess.run(["blkid", "-p", "-o", "export", device], capture_output=True, text=True)
    fields = dict(line.split("=", 1) for line in blkid.stdout.splitlines() if "=" in line)
    if fields.get("TYPE"):
        info["filesystem"] = fields["TYPE"]
    info["dev_t"] = (major << 20) | minor
    return info


def _tool_version() -> str:
    try:
        from importlib.metadata import version
        return version("tracereplay")
    except Exception:  # not installed as a distribution: running from a checkout
        return "unknown"


class _Stopper:
    """SIGINT, SIGTERM and SIGHUP end the wait instead of raising, so cleanup runs in order;
    restored on exit.

    The handler only records the signal and writes a byte to a pipe that `wait` selects on.
    It runs in the main thread between two bytecodes, perhaps while that thread holds a
    lock: one that called `Event.set()` deadlocked against the interrupted `Event.wait`,
    which holds the same lock, and the capture then ignored every further signal.
    """

    def __init__(self, stop: threading.Event | None = None):
        self.signal = None
        self._old = {}
        self._stop = stop

    def __enter__(self):
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.signal = signum
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:  # the pipe is full of earlier signals: it wakes the wait already
            pass

    @property
    def stopped(self) -> bool:
        return self.signal is not None or (self._stop is not None and self._stop.is_set())

    def wait(self, timeout: float | None) -> None:
        """Sleep up to `timeout` seconds (None: no limit), less if a signal comes."""
        if self._stop is not None:  # a caller's stop event is polled: no thread, no lock shared
            timeout = _STOP_POLL_S if timeout is None else min(timeout, _STOP_POLL_S)
        if not self.stopped:
            select.select([self._wake_r], [], [], timeout)

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}
        os.close(self._wake_r)
        os.close(self._wake_w)


def _choose_backend(backend: str, device: str, notices: list) -> str:
    if backend not in BACKENDS:
        raise CaptureError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if backend == "tracefs":
        return "tracefs"
    why = blktrace_backend.probe(device)
    if why is None:
        return "blktrace"
    if backend == "blktrace":
        raise CaptureError(f"{why}; use --backend tracefs, which works under lockdown")
    notices.append(f"{why}; capturing with tracefs")
    return "tracefs"


def _wait(stopper: _Stopper, proc, deadline) -> bool:
    """Wait for the command, the deadline or a signal; True if a signal ended the wait."""
    while not stopper.stopped:
        if proc is not None and proc.poll() is not None:
            return False
        if deadline is not None and time.monotonic() >= deadline:
            return False
        timeout = 0.05 if proc is not None else None
        if deadline is not None:
            timeout = min(timeout or 1.0, max(0.0, deadline - time.monotonic()))
        stopper.wait(timeout)
    return True


def _record(session, backend, stopper, command, duration, on_start):
    """While `session` records: run `command` until it exits, or wait `duration` seconds or for
    a signal; then end the command and stop the session, however the wait ends.

    Returns (wall-clock start, interrupted by a signal, the command's exit status or None).
    """
    wall = datetime.datetime.now(datetime.timezone.utc)
    if on_start is not None:
        on_start(backend)
    deadline = None if duration is None else time.monotonic() + duration
    proc = None
    try:
        if command:
            try:
                proc = subprocess.Popen(command)
            except OSError as exc:
                raise CaptureError(f"cannot run {command[0]}: {exc.strerror}") from None
        interrupted = _wait(stopper, proc, deadline) and (proc is not None or deadline is not None)
    finally:
        status = _end_command(proc)
        session.stop()
    return wall, interrupted, status


def _end_command(proc) -> int | None:
    if proc is None:
        return None
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=_TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def capture(device: str, output, *, command: list[str] | None = None, duration: float | None = None,
            backend: str = "auto", strict: bool = False, name: str | None = None,
            buffer_kb: int | None = None, notices: list | None = None,
            stop: threading.Event | None = None, on_start=None, force: bool = False) -> CaptureResult:
    """Trace `device` while `command` runs, for `duration` seconds, or until SIGINT/SIGTERM/`stop`.

    `on_start(backend)` is called once events are being recorded, before `command` starts.
    Writes the trace to `output` atomically (an existing one is replaced only with `force`;
    traces.outputs decides, before tracing starts) and returns what was captured. Raises
    CaptureError when the capture cannot run, or with strict=True when events were lost
    (then no trace is written). Everything set up is removed however this returns.
    """
    notices = [] if notices is None else notices
    output = Path(output)
    if duration is not None and not 0 < duration <= YEAR_S:  # nan too: it would never end
        raise CaptureError(f"--duration takes a number of seconds above 0 and at most {YEAR_S:,} "
                           f"(a year), not {duration:g}")
    check_output(output, force=force)
    if os.geteuid() != 0:
        raise CaptureError("capture needs root (tracefs and block devices); run it with sudo")
    info = device_info(device)
    chosen = _choose_backend(backend, device, notices)
    if chosen == "blktrace":
        return _capture_blktrace(device, output, info, command, duration, strict, name, notices, stop,
                                 on_start, force)

    with _Stopper(stop) as stopper:
        with TracefsSession(info["dev_t"], buffer_kb=buffer_kb) as session:
            for stale in session.removed_stale:
                notices.append(f"removed tracefs instance {stale}, left recording by a capture "
                               "that was killed")
            session.start()
            wall, interrupted, status = _record(session, "tracefs", stopper, command, duration, on_start)
            decoded = session.decode()
            overruns = session.overruns
            start_ns = session.start_mono_ns
            instance = session.name
    built = build(decoded.events, start_ns)
    # Overwritten events show up both as page missed-event counts and as overruns: the
    # same losses seen twice, so the larger of the two is the count.
    lost = max(decoded.missed_events, overruns)
    cols = built.columns
    counts = {k: int(len(v["ts"])) for k, v in decoded.events.items()}
    capture_meta = {
        "backend": "tracefs",
        "instance": instance,
        "start_monotonic_ns": start_ns,  # ts_ns 0 on CLOCK_MONOTONIC
        "events": counts,
        "pages": decoded.pages,
        "pages_with_missed_events": decoded.pages_with_missed,
        "missed_events": decoded.missed_events,
        "overruns": overruns,
        "lost_events": lost,
        "unmatched_issues": built.unmatched_issues,
        "orphan_completions": built.orphan_completions,
        "skipped_requests": built.skipped,
        "interrupted": interrupted,
        "command_status": status,
        # When the processes that did I/O slept (nanosleep): waits, not their own work.
        "sleeps": sleeps(decoded.events, start_ns, np.unique(cols["pid"])),
    }
    if lost:
        notices.append(f"{lost} events were lost ({decoded.missed_events} missed in pages, "
                       f"{overruns} buffer overruns); the trace is incomplete")
    if strict and lost:
        raise CaptureError(f"{lost} events were lost and --strict was given; no trace was written. "
                           "A larger buffer or a lower I/O rate avoids losses")
    if built.unmatched_issues:
        notices.append(f"{built.unmatched_issues} requests were still in flight at the end; "
                       "their latency_ns is -1")
    metadata = _metadata(info, output, name, command, wall, "tracefs", duration, capture_meta)
    _write(output, cols, metadata, force)
    return CaptureResult(output, len(cols["ts_ns"]), "tracefs", lost, metadata, interrupted, status, notices,
                         stopper.signal if interrupted else None)


def _metadata(info, output, name, command, wall, backend, duration, capture_meta) -> dict:
    device = {k: v for k, v in info.items() if k not in ("size", "logical_block_size") and v is not None}
    traced = shlex.join(command) if command else None
    what = f"`{traced}`" if traced else (f"{duration:g} s" if duration else "until stopped")
    return {
        "name": name or output.name.removesuffix(".parquet"),
        "description": f"Block I/O of {info['path']} captured with {backend} during {what}.",
        "source": {
            "kind": f"capture:{backend}",
            "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "traced_command": traced,
            "tool_version": _tool_version(),
            **capture_meta,
        },
        "device": device,
        "device_size": info["size"],
        "logical_block_size": info["logical_block_size"],
        "host": platform.node(),
        "kernel": platform.release(),
        "start_wallclock": wall.isoformat(),
        "provenance": f"captured on {platform.node()} from {info['path']} by tracereplay capture",
    }


def _write(output: Path, cols: dict, metadata: dict, force: bool) -> None:
    """The trace at `output`; where it finds no room (a full filesystem), in the temporary
    directory instead, as a capture cannot be taken again, and a CaptureError says where."""
    try:
        return _write_trace(output, cols, metadata, force)
    except OSError as e:
        if e.errno not in NO_ROOM:
            raise
        problem = f"cannot write {output}: {os.strerror(e.errno)}"
    kept = Path(tempfile.gettempdir()) / f"tracereplay-capture-{os.getpid()}-{output.name}"
    try:
        _write_trace(kept, cols, metadata, False)
    except OSError as e:
        raise CaptureError(f"{problem}, nor {kept}: {e.strerror or e}; the capture is lost") from None
    raise CaptureError(f"{problem}; the capture is kept in {kept} instead: move it where it belongs")


def _write_trace(output: Path, cols: dict, metadata: dict, force: bool) -> None:
    names = list(schema.TRACE_ARROW_SCHEMA.names) + [n for n in schema.OPTIONAL_COLUMNS if n in cols]
    types = {f.name: f.type for f in schema.TRACE_ARROW_SCHEMA}
    types.update(schema.OPTIONAL_COLUMNS)
    with TraceWriter(output, [(n, types[n]) for n in names], metadata, force=force) as writer:
        total = len(cols["ts_ns"])
        for start in range(0, max(total, 1), MAX_ROW_GROUP_ROWS):
            writer.write({n: cols[n][start:start + MAX_ROW_GROUP_ROWS] for n in names})


def _capture_blktrace(device, output, info, command, duration, strict, name, notices, stop, on_start,
                      force):
    """The blktrace path: run blktrace around the command, then decode its stream."""
    with _Stopper(stop) as stopper:
        with blktrace_backend.BlktraceSession(info["path"]) as session:
            wall, interrupted, status = _record(session, "blktrace", stopper, command, duration, on_start)
            fmt_meta, chunks = session.read()
            parts = list(chunks)
    cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if parts else {
        "ts_ns": np.empty(0, np.int64), "op": np.empty(0, np.uint8),
        "offset": np.empty(0, np.int64), "length": np.empty(0, np.int64)}
    lost = int(fmt_meta.get("lost_events", 0)) if isinstance(fmt_meta, dict) else 0
    if strict and lost:
        raise CaptureError(f"{lost} events were lost and --strict was given; no trace was written")
    capture_meta = {"backend": "blktrace", "lost_events": lost, "interrupted": interrupted,
                    "command_status": status, "decoder": fmt_meta}
    metadata = _metadata(info, output, name, command, wall, "blktrace", duration, capture_meta)
    _write(output, cols, metadata, force)
    return CaptureResult(output, len(cols["ts_ns"]), "blktrace", lost, metadata, interrupted, status, notices,
                         stopper.signal if interrupted else None)
