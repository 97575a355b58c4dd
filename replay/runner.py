"""Running a replay: the trace streams in by chunks, the native engine issues them, and the
results stream out to a Parquet file and a summary. Python prepares, Rust runs.
"""
import contextlib
import errno
import functools
import gc
import glob
import math
import os
import platform
import _thread
import signal
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path

import numpy as np
import pyarrow as pa

from analysis.summary import RunSummary
from analysis.summary import warm_up as summary_warm_up
from replay import __version__, _engine, remap
from replay.options import ENGINES, Engine, RunOptions, Timing, check_options  # noqa: F401 (the runner's API)
from replay.signals import StopSignals, signum_of
from replay.targets import scratch_target
from traces import library, schema
from traces.errors import EngineSetupError, ReplayError, TargetError
from traces.outputs import check_output
from traces.targets import Target, check_safe_to_write, inspect_target, unclaimed
from traces.schema import Op
from traces.trace import (JournalKept, TraceWriter, convert_journal, journal_in_use, open_trace,
                          read_journal)

# errnos with which a sandbox refuses io_uring (Docker's default seccomp profile: EPERM).
_URING_REFUSED = (errno.EPERM, errno.ENOSYS, errno.EACCES)

# How often `progress` is called while a run goes.
PROGRESS_S = 0.25
# A trace whose first I/O is due later than this after the start is almost certainly
# stamped with absolute times (seconds since 1970, or since boot).
MAX_FIRST_DUE_S = 86400
# Causal timing: the most think time a --think-scale may stretch a trace to (a year), far
# inside the engine's signed nanosecond clock, which 1e308 wrapped to a negative due time.
MAX_THINK_S = 365 * 86400


def check_causal(source, options: RunOptions) -> None:
    """Raise ReplayError when causal timing cannot replay `source` as asked."""
    from analysis import causal

    if options.workers > 1:
        raise ReplayError("causal timing runs on one worker (an I/O waits for I/Os another worker "
                          "would issue): drop --workers")
    if options.read_only:
        raise ReplayError("causal timing replays every I/O: with --read-only, reads would wait for "
                          "writes that are skipped")
    if options.heuristic not in causal.HEURISTICS:
        raise ReplayError(f"unknown heuristic {options.heuristic!r}: use one of {', '.join(causal.HEURISTICS)}")
    if not (math.isfinite(options.think_scale) and options.think_scale >= 0):
        raise ReplayError(f"--think-scale must be a finite number >= 0, not {options.think_scale}")
    if not isinstance(source, TraceSource):
        raise ReplayError("causal timing needs a captured trace (with pid and latency_ns), not a generator")
    causal.check_columns(source.path, source.column_names)
    # The think times along any chain of I/Os are disjoint stretches of the trace, so the
    # trace's duration times the scale bounds the think time a replay can add up.
    scan = source.scan
    trace_s = ((scan.last_ts or 0) - (scan.first_ts or 0)) / 1e9
    if trace_s * options.think_scale > MAX_THINK_S:
        raise ReplayError(f"--think-scale {options.think_scale:g} would stretch the think times of the "
                          f"trace's {trace_s:.3g} s to more than a year; give at most "
                          f"{MAX_THINK_S / trace_s:.3g}")


def check_trace(source, options: RunOptions) -> None:
    """Raise ReplayError for a trace that cannot be replayed as asked: no rows, or a first I/O
    due more than a day after the start."""
    scan = source.scan
    if scan.rows == 0 and isinstance(source, TraceSource):  # a generator may be asked for none
        raise ReplayError(f"{source.describe(0)['path']} holds no I/Os (0 rows): there is nothing "
                          "to replay; check how the trace was made")
    first = getattr(scan, "first_ts", None)
    if options.timing != Timing.afap and first is not None and first / options.speed > MAX_FIRST_DUE_S * 1e9:
        raise ReplayError(
            f"the trace's first I/O is due {first / options.speed / 1e9:,.0f} s after the start "
            f"(ts_ns {first}), more than a day: its times look absolute; rebase them to start "
            "at 0 (replay convert, or ts_ns - ts_ns[0]), or replay it with --afap")


@dataclass
class RunOutcome:
    """What a run produced. `output` is None for a dry run."""

    output: Path | None
    summary: RunSummary
    interrupted: bool
    target: Target
    rows: int
    notices: list[str] = field(default_factory=list)
    time_limited: bool = False  # stopped at options.time_limit_s
    engine_cpu_s: float = 0.0  # CPU of the engine threads (not the kernel's I/O workers)
    engine: str | None = None  # what ran it: not the one asked for after a fallback (notices say why)
    signum: int | None = None  # the signal that interrupted it (SIGINT, SIGTERM, SIGHUP)


@dataclass
class _Scan:
    """What one pass over the trace learns before anything is issued."""

    rows: int = 0
    span: int = 0
    max_length: int = 0  # the longest I/O of any kind (remapping aligns spans with it)
    # The longest read or write: what the engine's buffers must hold. Discards and flushes
    # carry no data: one 1 GiB discard used to size 4.4 GB of buffers.
    max_data_length: int = 0
    first_ts: int | None = None  # ts_ns of the first row
    last_ts: int | None = None  # the latest ts_ns of any row
    counts: np.ndarray = field(default_factory=lambda: np.zeros(len(Op), dtype=np.int64))

    @property
    def writes(self) -> bool:
        return bool(self.counts[Op.WRITE] + self.counts[Op.DISCARD] + self.counts[Op.FLUSH])


# Results rows per row group: ~30 MB held, and a results file's footer, which the writer
# keeps in memory, grows by 6.95 KB per row group, 0.84 KB once written (bench/bench_suite.py).
RESULT_GROUP_ROWS = 1 << 19
# Results stream into a journal (TraceWriter's journal_s) that is fsynced this often, and
# each piece pushed to the engine is cut to complete within about this long, so a SIGKILL
# or a power cut loses seconds of rows, not the run (see _pieces).
RESULT_FLUSH_S = 2.0
# Room a results row takes at most, journal and Parquet file together (both exist while
# the journal is converted at the end), checked against the free space before any I/O:
# measured 11.4 + 6.3 bytes over 20M random 4 KiB I/Os on the null engine (both lz4).
RESULT_ROW_BYTES = 24

# A trace whose replayed columns take at most this much memory is kept from the scan, so the
# run does not decode and validate it a second time while the engine needs the CPU.
CACHE_BYTES = 64 << 20


def _scan(trace, columns, rows, keep) -> tuple[_Scan, list[dict] | None]:
    """Validates every column read too, so a bad row is found before any I/O is issued.
    With `keep`, also returns the chunks read."""
    scan, cache = _Scan(), [] if keep else None
    for chunk in trace.chunks(columns=columns, rows=rows):
        if len(chunk["op"]):
            if scan.first_ts is None:
                scan.first_ts = int(chunk["ts_ns"][0])
            scan.last_ts = max(scan.last_ts or 0, int(chunk["ts_ns"].max()))
            scan.span = max(scan.span, int((chunk["offset"] + chunk["length"]).max()))
            scan.max_length = max(scan.max_length, int(chunk["length"].max()))
            data = chunk["length"][(chunk["op"] == Op.READ) | (chunk["op"] == Op.WRITE)]
            if len(data):
                scan.max_data_length = max(scan.max_data_length, int(data.max()))
        scan.counts += np.bincount(chunk["op"], minlength=len(Op))[: len(Op)]
        scan.rows += len(chunk["op"])
        if keep:
            cache.append(chunk)
    return scan, cache


def _row_bytes(name) -> int:
    """Memory per row of a column once read (a comm string: some tens of bytes)."""
    if name in schema.TRACE_COLUMNS:
        return schema.TRACE_COLUMNS[name].itemsize
    type_ = schema.OPTIONAL_COLUMNS[name]
    return type_.bit_width // 8 if pa.types.is_integer(type_) else 64


class TraceSource:
    """A trace file as the runner reads it: one validating pass (`_scan`) learns its span,
    longest I/O and op mix before anything is issued, then `chunks` streams it: from memory
    when its replayed columns fit in CACHE_BYTES (the scan kept them), else from the file."""

    def __init__(self, trace, rows=RunOptions.chunk_rows):
        self.path = library.resolve(str(trace))
        self.tf = open_trace(self.path)
        self.replayed = [n for n in self.tf.column_names
                         if n in schema.TRACE_COLUMNS or n in schema.OPTIONAL_COLUMNS]
        self.rows = rows
        keep = self.tf.num_rows * sum(map(_row_bytes, self.replayed)) <= CACHE_BYTES
        columns = self.replayed if keep else list(schema.TRACE_COLUMNS)
        self.scan, self._cache = _scan(self.tf, columns, rows, keep)
        self.name = self.tf.metadata.get("name", self.tf.path.stem)
        self.stem = self.path.stem  # names the default results file
        self.metadata = self.tf.metadata
        self.column_names = self.tf.column_names
        self.buffer_length = self.scan.max_data_length

    def describe(self, rows_done: int) -> dict:
        return {"path": str(self.tf.path), "rows": self.scan.rows, "metadata": self.metadata}

    def chunks(self, columns, rows):
        if self._cache is not None and rows == self.rows and set(columns) <= set(self.replayed):
            # Copies of the dicts: the runner replaces columns (remapped offsets) in place.
            return ({name: chunk[name] for name in columns} for chunk in self._cache)
        return self.tf.chunks(columns=columns, rows=rows)


class GeneratorSource:
    """A synthetic generator (synth.generators) as the runner reads it, never materialised.

    Its span, longest I/O and op mix come from its parameters (`synth_describe`), so an
    unbounded closed-loop generator (run to a time limit) needs no pass; a generator of
    another kind is scanned once, which only a finite one allows. `rows` is None when the
    length is unknown in advance; the results metadata then records the rows generated.
    """

    def __init__(self, generator, name=None):
        self.generator = generator
        self.name = name or generator.name
        self.scan, self.buffer_length = _describe_generator(generator)
        self.metadata = {"name": self.name, "kind": "synthetic", "generator": generator.name,
                         "parameters": generator.parameters()}
        self.column_names = list(schema.TRACE_COLUMNS)
        self.stem = self.name
        self.generated = 0

    def describe(self, rows_done: int) -> dict:
        return {"path": f"synth:{self.generator.name}",
                "rows": self.scan.rows if self.scan.rows is not None else self.generated,
                "metadata": self.metadata}

    def chunks(self, columns, rows):
        for chunk in self.generator.chunks(rows):
            self.generated += len(chunk["op"])
            yield chunk


def _describe_generator(gen) -> tuple[_Scan, int]:
    """(scan with rows None when unknown, the longest read or write) from a generator's
    parameters. Discards (a purge) need no buffer, so they do not set the buffer length."""
    from synth import generators as g

    stages = gen.stages if isinstance(gen, g.Sequence) else [gen]
    scan = _Scan(rows=0)
    buffer_length = 0
    for stage in stages:
        counts = np.zeros(len(Op), dtype=np.int64)
        if isinstance(stage, g.Mix):
            rows = stage.count if stage.count is not None else None
            longest = int(stage.sizes.max())
            counts[Op.READ] = stage.read_share > 0
            counts[Op.WRITE] = stage.read_share < 1
        elif isinstance(stage, g.ActLoad):
            rows, longest = None, stage.large_block
            counts[Op.READ] = counts[Op.WRITE] = 1
        elif isinstance(stage, g.Purge):
            rows, longest = 1, 0
            counts[Op.DISCARD] = 1
            scan.max_length = max(scan.max_length, stage.span)
        else:  # a kind this module does not know: one cheap pass, for finite generators only
            rows = longest = 0
            for chunk in stage.chunks():
                rows += len(chunk["op"])
                if len(chunk["op"]):
                    scan.max_length = max(scan.max_length, int(chunk["length"].max()))
                data = chunk["length"][(chunk["op"] == Op.READ) | (chunk["op"] == Op.WRITE)]
                if len(data):
                    longest = max(longest, int(data.max()))
                counts += np.bincount(chunk["op"], minlength=len(Op))[: len(Op)]
        scan.span = max(scan.span, int(stage.span_end))
        scan.max_length = max(scan.max_length, longest)
        buffer_length = max(buffer_length, longest)
        scan.max_data_length = buffer_length
        scan.counts += counts
        scan.rows = None if rows is None or scan.rows is None else scan.rows + rows
    return scan, buffer_length


def _source(trace):
    if isinstance(trace, (TraceSource, GeneratorSource)):
        return trace
    if hasattr(trace, "chunks") and hasattr(trace, "parameters"):
        return GeneratorSource(trace)
    return TraceSource(trace)


class _Ticker:
    """Calls `progress(rows_done, rows_total, elapsed_s)` every PROGRESS_S seconds, from a
    thread, from the start of the run to its end, with the rows the engines have completed."""

    def __init__(self, progress, merger, total):
        self.progress, self.merger, self.total = progress, merger, total
        self._engines = [rep.progress() for rep in merger.reps]
        self.running = False
        self._stop = threading.Event()
        self._thread = None
        self._start_ns = 0

    def start(self, start_ns: int):
        self.running = True
        self._start_ns = start_ns
        if self.progress is not None:
            self._thread = threading.Thread(target=self._loop, name="replay-progress", daemon=True)
            self._thread.start()

    def _loop(self):
        while True:
            try:
                self.tick()
            except KeyboardInterrupt:
                # A callback that interrupts (as a UI's cancel button may) stops the run as
                # Ctrl-C does: the main thread gets the SIGINT it would have had.
                _thread.interrupt_main(signal.SIGINT)
                return
            if self._stop.wait(PROGRESS_S):
                return

    def done(self) -> int:
        # The engines count the rows they completed, so progress moves between the chunks
        # they hand back (65,536 rows, seconds of I/O on a slow drive).
        done = max(self.merger.done, sum(p.completed() for p in self._engines))
        return done if self.total is None else min(done, self.total)

    def tick(self):
        elapsed_ns = max(time.monotonic_ns() - self._start_ns, 0)
        self.progress(self.done(), self.total, elapsed_ns / 1e9)

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            with contextlib.suppress(KeyboardInterrupt):  # the run is over: nothing to stop
                self.tick()


class _TimeUp(Exception):
    """The run reached its time limit (raised only while waiting on the engine)."""


class _Deadline:
    """Ends a run at its time limit. Checked between chunks, and (in the main thread) an
    interval timer interrupts the waits on the engine, whose loops poll Python's signal
    handlers every few ms: without it, a full engine queue (4 chunks, seconds of I/O on a
    slow device) would overrun the limit. The handler raises only inside those waits, so
    it never lands half-way through writing a chunk."""

    def __init__(self, seconds, stops=None):
        self.seconds = seconds
        self.stops = stops  # StopSignals, whose signals also interrupt only the waits
        self.at = None
        self.passed = False
        self.waiting = False
        self._old = None

    def start(self):
        """Start the clock: at the first push, so that making the first chunk (loading a
        generator's Numba kernels takes a few hundred ms) does not eat a short run."""
        if self.seconds is None or self.at is not None:
            return
        self.at = time.monotonic() + float(self.seconds)
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, max(float(self.seconds), 1e-6))

    def _fire(self, signum, frame):
        self.passed = True
        if self.waiting:
            raise _TimeUp

    def check(self):
        if self.at is not None and (self.passed or time.monotonic() >= self.at):
            self.passed = True
            raise _TimeUp

    def wait(self, call, *args):
        """call(*args), interruptible by the time limit."""
        self.waiting = True  # first: a time-up from here on raises
        try:
            self.check()
            return self.stops.wait(call, *args) if self.stops else call(*args)
        finally:
            self.waiting = False

    def cancel(self):
        if self._old is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old)
            self._old = None


def null_target(size: int) -> Target:
    """The stand-in target of a run on the null engine, which opens no file: `size` bytes."""
    return Target(path="(null engine)", kind="null", size=max(size, 512),
                  logical_block_size=512, physical_block_size=512)


def _start_engines(target: Target, options: RunOptions, writable: bool, max_length: int, notices):
    """Running Replayers, one per worker, plus the engine and O_DIRECT setting they use.

    The first one settles the engine: psync where io_uring is refused, or, unless an engine
    was asked for, where the target's driver runs I/O on the submitting CPU; buffered I/O
    where the target refuses O_DIRECT (each said in a notice). None issues anything before
    `_start_together` gives them their common start.
    """
    depth = options.qd if options.timing == Timing.afap else options.max_inflight
    _check_memory(options.workers, depth, max_length)
    engine, direct = options.engine or "io_uring", True
    if options.engine is None and target.sync_driver:
        notices.append(f"{target.path}'s driver runs each I/O on the CPU that submits it, which "
                       "io_uring would hand to a kernel worker thread: using the psync engine, "
                       "with one thread per CPU running the I/Os (--engine io_uring to override)")
        engine = "psync"
    if target.kind == "block":
        unclaimed(target.path)  # a claim that outlives its run goes; one that stays fails below
    reps = []
    while len(reps) < options.workers:
        try:
            reps.append(_engine.Replayer(
                None if engine == "null" else target.path,
                engine=engine, timing=Timing(options.timing).value, speed=options.speed, depth=depth,
                # Only the first worker opens a block device O_EXCL (the kernel refuses a
                # second exclusive open with EBUSY); its claim keeps the device from being
                # mounted for the whole run. The others discard with fallocate(PUNCH_HOLE),
                # which block devices also accept.
                writable=writable, direct=direct, is_block=target.kind == "block" and not reps,
                sync_driver=target.sync_driver,
                max_length=max_length, data=options.data,
                think_scale=options.think_scale,
            ))
        except OSError as e:
            if reps:
                raise ReplayError(f"cannot start worker {len(reps) + 1}: {e}") from None
            setup = isinstance(e, EngineSetupError)
            if engine == "io_uring" and setup and e.errno in _URING_REFUSED:
                notices.append(f"io_uring is refused here ({errno.errorcode[e.errno]}); "
                               "using the psync engine (a pool of pread/pwrite threads)")
                engine = "psync"
            elif direct and e.errno == errno.EINVAL and target.kind == "file":
                notices.append(f"{target.path} does not support O_DIRECT; replaying with "
                               "buffered I/O, so the page cache will serve some reads")
                direct = False
            elif e.errno == errno.EBUSY:
                raise ReplayError(f"{target.path} is busy: it is mounted or claimed by another "
                                  "user; unmount it or choose another target") from None
            elif setup:
                raise  # an EngineUnavailable whose message suggests another engine
            else:
                raise ReplayError(f"{e.strerror or e}: cannot replay on {target.path}") from None
    return reps, engine, direct


def _worker_bytes(depth: int, max_length: int) -> int:
    """Memory one worker's buffers take (engine/src/data.rs, Buffers::new): the pool of
    write data, and the read slots, at most as large as the pool."""
    slot = -(-max(max_length, 1) // 4096) * 4096
    pool = max(2 * slot, 8 << 20)
    return pool + slot * min(depth, pool // slot)


def _check_memory(workers: int, depth: int, max_length: int, available: int | None = None) -> None:
    """Refuse workers whose buffers would not fit in the memory `available` (default: the
    kernel's MemAvailable): the OOM killer would otherwise end the run without a word."""
    if available is None:
        try:
            with open("/proc/meminfo") as f:
                meminfo = dict(line.split(":", 1) for line in f)
            available = int(meminfo["MemAvailable"].split()[0]) * 1024
        except (OSError, KeyError, ValueError):
            return
    need = workers * (_worker_bytes(depth, max_length) + (1 << 20))  # + thread stack and ring
    if need > available:
        raise ReplayError(
            f"{workers} workers need about {remap.human_bytes(need)} of buffers (up to "
            f"{remap.human_bytes(need // workers)} each) but {remap.human_bytes(available)} is "
            "available; use fewer --workers, a lower --qd/--max-inflight, or shorter I/Os")


# The workers' common start is this far after their first chunk is ready: time to hand
# it to every worker (32 workers, a 65,536-row chunk: ~5 ms).
START_AHEAD_NS = 20_000_000


def _start_together(reps, at: int | None = None) -> int:
    """Give every worker one common start instant, a little ahead (or `at`): their first I/Os
    are all due from then on, so building and feeding the workers one after another is not
    recorded as lateness. Returns that instant (monotonic ns)."""
    start_ns = time.monotonic_ns() + START_AHEAD_NS if at is None else at
    for rep in reps:
        rep.start_at(start_ns)
    return start_ns


def _stop_signals(fn):
    """SIGTERM and SIGHUP end the call as Ctrl-C does (a KeyboardInterrupt, `Interrupted`),
    so a scratch target and everything else set up is removed on them too."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with StopSignals():
            return fn(*args, **kwargs)
    return wrapper


def _deferred_signals(fn):
    """Passes `stops`: SIGINT, SIGTERM and SIGHUP raise only inside its waits on the engine,
    never half-way through writing a chunk or closing the results."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with StopSignals(defer=True) as stops:
            return fn(*args, stops=stops, **kwargs)
    return wrapper


def default_output(trace_name: str, target: Target) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(f"{trace_name}-{Path(target.path).name.strip('()').replace(' ', '-')}-{stamp}.parquet")


@_stop_signals
def replay(trace, target=None, options: RunOptions | None = None, output=None,
           progress=None, notices=None, consumers=(), metadata=None) -> RunOutcome:
    """Replay `trace` (a path, a name in the bundled library, a synth generator, or a
    TraceSource/GeneratorSource) on `target` (a block device or a regular file; None for a
    scratch file sized to the trace).

    `progress(rows_done, rows_total, elapsed_s)` is called from a thread every PROGRESS_S
    seconds from the first I/O, and once at the end (rows_total is None for a generator of
    unknown length; in timed mode rows_done counts the rows due by then until their chunk
    is back). Each consumer's `add(chunk)` gets every results
    chunk written (for example analysis.scoring.Bins). `metadata` is merged into the results
    file's metadata. Ctrl-C (KeyboardInterrupt) ends the run early: what was done is still
    written, marked interrupted; reaching `options.time_limit_s` ends it the same way but is
    not an interruption. Returns the outcome; raises ReplayError subclasses for setup problems.
    """
    options = options or RunOptions()
    # Every check that needs no target comes before anything is opened or written.
    check_options(options)
    notices = [] if notices is None else notices
    source = _source(trace)
    inputs = [(source.path, "the trace being replayed")] if isinstance(source, TraceSource) else []
    tgt = None if target is None else inspect_target(str(target))  # reads only
    if output is not None:
        check_output(output, inputs=inputs, target=tgt, force=options.force)
    check_trace(source, options)
    if options.timing == Timing.causal:
        check_causal(source, options)
    scan = source.scan
    writes = scan.writes and not options.read_only
    cleanup = None
    if tgt is None and options.engine == "null":
        tgt = null_target(scan.span)
    elif tgt is None:
        tgt, cleanup = scratch_target(scan.span, writes=writes)
        notices.append(f"no target given: replaying on a scratch file of {remap.human_bytes(tgt.size)} "
                       f"({tgt.path}), removed afterwards")
    try:
        if writes and target is not None:
            if inputs and tgt.kind == "file" and os.path.samefile(tgt.path, source.path):
                raise TargetError(f"the target {target} is the trace being replayed: its writes would "
                                  "overwrite it; give another TARGET, or --read-only")
            check_safe_to_write(tgt, options.destroy_data)
        mapping = remap.plan_mapping(scan.span, scan.max_length, tgt.size, tgt.logical_block_size,
                                     options.remap, target_path=tgt.path)
        if options.read_only and scan.writes and scan.rows is not None:
            skipped = int(scan.rows - scan.counts[Op.READ])
            notices.append(f"--read-only: skipping {skipped} writes, discards and flushes")
        if options.dry_run:
            return RunOutcome(None, RunSummary(), False, tgt, 0, notices)
        output = Path(output) if output else default_output(source.stem, tgt)
        causal = options.timing == Timing.causal
        host_ns = _host_costs(tgt, options, writes, notices) if causal and options.calibrate else None
        return _run(source, tgt, mapping, scan, options, output, writes, progress, notices,
                    consumers, metadata or {}, host_ns)
    finally:
        if cleanup:
            cleanup()


def _host_costs(tgt, options, writes, notices):
    """Causal timing: the replayer's own time per I/O on `tgt` (replay.calibrate), measured
    before the target is opened; None where it cannot be."""
    from replay import calibrate

    if options.engine == "null":
        return None
    if not writes:
        notices.append("causal timing: this trace does not write, so the replayer's own time per I/O is "
                       "not measured on the target (its probes write); think times are replayed as captured")
        return None
    if not calibrate.can_calibrate(tgt.kind):
        notices.append("causal timing: the replayer's own time per I/O is measured on a block device, as "
                       "root; here each think time is replayed as captured, with the replayer's own "
                       "submission added to it")
        return None
    return calibrate.host_costs(tgt.path, options.engine, notices)


@_deferred_signals
def _run(source, tgt, mapping, scan, options, output, writes, progress, notices, consumers,
         extra, host_ns, stops) -> RunOutcome:
    # A run to a time limit (a generator with no end) has no row count to check.
    _check_room(output, None if options.time_limit_s else scan.rows)
    buf_length = max(4096, -(-source.buffer_length // 4096) * 4096 + 2 * tgt.logical_block_size)
    summary_warm_up()
    reps, engine, direct = _start_engines(tgt, options, writes, buf_length, notices)
    metadata = {
        **extra,
        "name": source.name,
        "kind": "results",
        "trace": source.describe(0),
        "target": asdict(tgt),
        "run": {
            "engine": engine, "mode": Timing(options.timing).value,
            **({"think_scale": options.think_scale, "heuristic": options.heuristic,
                "host_cost_ns": None if host_ns is None else host_ns.tolist()}
               if options.timing == Timing.causal else {}),
            "speed": options.speed, "qd": options.qd, "max_inflight": options.max_inflight,
            "workers": options.workers, "remap": mapping.mode, "read_only": options.read_only,
            "data": options.data, "direct": direct, "time_limit_s": options.time_limit_s,
            # What issue_ns times (README: Results); results without the key timed io_uring's
            # I/Os when the submitting call returned.
            "issue_ns": "system call start",
            "started": datetime.now(timezone.utc).isoformat(),
        },
        "host": platform.node(), "kernel": platform.release(),
        "versions": {"tracereplay": __version__, "pyarrow": pa.__version__, "numpy": np.__version__},
    }
    columns = [(name, schema.OPTIONAL_COLUMNS.get(name) or pa.from_numpy_dtype(schema.TRACE_COLUMNS[name]))
               for name in source.column_names
               if name in schema.OPTIONAL_COLUMNS or name in schema.TRACE_COLUMNS]
    keep = [name for name, _ in columns]
    columns += schema.RESULT_ARROW_FIELDS
    # lz4: half zstd's CPU time per row (0.12 vs 0.24 us), which the engine's host shares.
    try:
        writer = TraceWriter(output, columns, metadata, compression="lz4",
                             group_rows=RESULT_GROUP_ROWS, journal_s=RESULT_FLUSH_S, force=options.force)
    except (OSError, ReplayError) as e:  # ReplayError: another run claimed `output` meanwhile
        for rep in reps:
            rep.stop()
        if isinstance(e, ReplayError):
            raise
        raise ReplayError(f"cannot write the results in {output.parent or '.'} ({e.strerror or e}); "
                          "nothing was replayed") from None
    _notice_journals(output, writer.tmp_path, notices)
    summary = RunSummary()
    merger = _Merger(reps, writer, summary, consumers)
    aligned = 0
    interrupted = time_up = False
    signum = None
    deadline = _Deadline(options.time_limit_s, stops)
    ticker = _Ticker(progress, merger, scan.rows)
    gc.disable()  # the run allocates few objects; collector passes only steal the engine's CPU
    annotator = None
    if options.timing == Timing.causal:
        from analysis.causal import Annotator, sleeps_of

        annotator = Annotator(options.heuristic, host_ns=host_ns, sleeps=sleeps_of(source.metadata))
    try:
        try:
            for chunk in _pieces(source.chunks(keep, options.chunk_rows), options, merger):
                if annotator is not None:  # parents and think times, streaming in row order
                    chunk["causal"] = annotator.add(chunk)
                if options.read_only:
                    reads = chunk["op"] == Op.READ
                    chunk = {name: col[reads] for name, col in chunk.items()}
                chunk["offset"], chunk["length"], n = remap.apply(
                    mapping, chunk["offset"], chunk["length"], chunk["op"])
                aligned += n
                deadline.start()
                if not ticker.running:
                    ticker.start(_start_together(reps, options.start_ns))
                deadline.wait(merger.push, chunk)
                merger.collect(block=False)
            for rep in reps:
                rep.close()
            while deadline.wait(merger.collect, True):
                pass
        except (KeyboardInterrupt, _TimeUp) as e:
            deadline.cancel()
            interrupted, time_up = isinstance(e, KeyboardInterrupt), isinstance(e, _TimeUp)
            if interrupted:
                signum = signum_of(e)
            for rep in reps:
                rep.stop()
            while merger.collect(block=True):
                pass
        deadline.cancel()
        stats = [rep.join() for rep in reps]
    except BaseException as e:
        deadline.cancel()
        for rep in reps:
            rep.stop()
        for rep in reps:
            try:
                rep.join()  # no I/O outlives the run; its error, if any, is `e` or after it
            except BaseException:
                pass
        path = _close_results(writer, merger, {"interrupted": True, "rows_done": merger.done,
                                               "trace": source.describe(merger.done),
                                               "summary": summary.to_dict()}, e)
        if isinstance(e, OSError):
            raise ReplayError(f"{e}; the {merger.done} I/Os done so far are in {path}") from None
        raise
    finally:
        ticker.stop()
        gc.enable()
    # Stopping at the time limit is how such a run ends, so the engines' "stopped" is no
    # interruption then; Ctrl-C is.
    interrupted = interrupted or (not time_up and any(s["interrupted"] for s in stats))
    if aligned:
        notices.append(f"aligned {aligned} I/Os to the target's {tgt.logical_block_size}-byte blocks")
    engine_cpu_s = sum(s["cpu_ns"] for s in stats) / 1e9
    path = _close_results(writer, merger, {
        "interrupted": interrupted, "rows_done": merger.done,
        "rows_issued": sum(s["rows_issued"] for s in stats),
        "time_limited": time_up, "trace": source.describe(merger.done),
        "aligned_ios": aligned,
        "engine_cpu_s": engine_cpu_s,
        "summary": summary.to_dict()})
    return RunOutcome(path, summary, interrupted, tgt, merger.done, notices, time_up, engine_cpu_s,
                      engine, signum if interrupted else None)


def _check_room(output: Path, rows) -> None:
    """Refuse, before any I/O, a results file that will not fit where it goes."""
    if not rows:
        return  # a generator of unknown length: the journal keeps what fits (_close_results)
    directory = output.parent if str(output.parent) else Path(".")
    try:
        fs = os.statvfs(directory)
    except OSError:
        return  # the writer's own open reports a directory it cannot use
    free, needed = fs.f_bavail * fs.f_frsize, rows * RESULT_ROW_BYTES
    if free < needed:
        raise ReplayError(
            f"the results of {rows:,} I/Os need up to {remap.human_bytes(needed)} ({needed} bytes) "
            f"but {directory} has {remap.human_bytes(free)} ({free} bytes) free; free some space "
            "or give -o on a larger filesystem")


def _notice_journals(output: Path, ours: Path, notices) -> None:
    """Say so when an earlier run into the same file left a journal that no run writes."""
    for journal in sorted(output.parent.glob(f"{glob.escape(output.name)}.*.partial")):
        if journal != ours and journal.stat().st_size and not journal_in_use(journal):
            notices.append(f"{journal} is the journal of an earlier run that did not finish: "
                           f"`replay recover {journal} -o FILE` makes its results file")


def _close_results(writer, merger, metadata: dict, cause=None) -> Path:
    """Finish the results file, or, where that fails (a full disk), raise one ReplayError that
    names the journal kept with every row written and how to recover it."""
    try:
        return writer.close(metadata)
    except JournalKept as e:
        problem = cause if isinstance(cause, OSError) else e.cause
        what = ("the results filesystem is full" if problem.errno == errno.ENOSPC
                else "the results cannot be written")
        raise ReplayError(
            f"{what} ({problem.strerror or problem}): the run stopped after {merger.done:,} I/Os; "
            f"the {e.rows:,} written are kept in {e.journal}: free some space, then "
            f"`replay recover {e.journal}` makes the results file") from None


def recover(journal, output=None, force=False) -> tuple[Path, int]:
    """Turn the journal (`OUT.<hex>.partial`) that a killed or failed run left into its
    results file, OUT or `output`, marked interrupted, then removes it; returns (path, rows).
    The rows are the journal's up to its last complete batch; the summary is computed from
    them. An existing results file is replaced only with `force`."""
    journal = Path(journal)
    if journal.is_file() and journal_in_use(journal):
        raise ReplayError(f"{journal} is still being written by a running replay, which makes "
                          "its results file when it ends; stop it first to recover its rows now")
    _, metadata, batches = read_journal(journal)
    if metadata.get("kind") != "results":
        raise ReplayError(f"{journal} is not the journal of a replay run's results")
    name = journal.name.removesuffix(".partial")
    output = Path(output) if output else journal.with_name(name.rsplit(".", 1)[0] if "." in name else name)
    check_output(output, inputs=[(journal, "the journal being recovered")], force=force)
    summary, rows = RunSummary(), 0

    def counted():
        nonlocal rows
        for batch in batches:
            summary.add({n: batch.column(i).to_numpy(zero_copy_only=False)
                         for i, n in enumerate(batch.schema.names)})
            rows += batch.num_rows
            yield batch

    def closing():
        return {"interrupted": True, "recovered_from": journal.name, "rows_done": rows,
                "summary": summary.to_dict()}

    try:
        path = convert_journal(journal, output, closing, "lz4", RESULT_GROUP_ROWS, counted(), force=force)
    except OSError as e:
        raise ReplayError(f"cannot write {output} ({e.strerror or e}); the journal is left as it "
                          "was") from None
    journal.unlink()
    return path, rows


def _pieces(chunks, options: RunOptions, merger):
    """The trace's chunks, cut so that each piece pushed completes within about RESULT_FLUSH_S:
    the engine hands back whole pieces, so a piece is what a SIGKILL can lose. With timing,
    by the trace's clock; with --afap, by the rate measured so far (8,192 rows to begin)."""
    started, rows = None, 8192
    span_ns = RESULT_FLUSH_S * options.speed * 1e9
    for chunk in chunks:
        n = len(chunk["op"])
        if options.timing != Timing.afap:
            ts = chunk["ts_ns"]
            if n == 0 or ts[-1] - ts[0] <= span_ns:
                yield chunk
                continue
            cuts = np.flatnonzero(np.diff((ts - ts[0]) // int(span_ns))) + 1
        else:
            if started is None:
                started = time.monotonic()
            elif merger.done:
                rate = merger.done / max(time.monotonic() - started, 1e-3)
                rows = int(min(max(rate * RESULT_FLUSH_S, 1024), 1 << 30))
            if n <= rows:
                yield chunk
                continue
            cuts = np.arange(rows, n, rows)
        for lo, hi in zip([0, *cuts], [*cuts, n]):
            yield {name: col[lo:hi] for name, col in chunk.items()}


class _Merger:
    """Deals each chunk's rows to the workers (row i to worker i % N), and puts their results
    back together in trace order as they finish, writing rows that were issued."""

    def __init__(self, reps, writer, summary, consumers=()):
        self.reps, self.writer, self.summary = reps, writer, summary
        self.consumers = list(consumers)
        self.pending = deque()  # chunks pushed, not yet written
        self.results = [deque() for _ in reps]  # per worker, in push order
        self.finished = set()  # workers whose run is over
        self.done = 0

    def push(self, chunk):
        n = len(self.reps)
        deps = chunk.pop("causal", None)  # causal timing's columns go to the engine, not the results
        self.pending.append(chunk)
        for w, rep in enumerate(self.reps):
            part = {name: np.ascontiguousarray(chunk[name][w::n])
                    for name in ("ts_ns", "op", "offset", "length")}
            flags = np.ascontiguousarray(chunk["flags"][w::n]) if "flags" in chunk else None
            if deps is None:
                rep.push(part["ts_ns"], part["op"], part["offset"], part["length"], flags)
            else:  # one worker: check_causal
                rep.push(part["ts_ns"], part["op"], part["offset"], part["length"], flags,
                         parent=deps["parent"].astype(np.uint32), parent2=deps["parent2"].astype(np.uint32),
                         think_ns=deps["think_ns"])

    def collect(self, block: bool) -> bool:
        """Take what the workers have finished (with block, wait for each worker's next chunk
        or its end) and write every complete chunk. False once nothing more can come."""
        for w, rep in enumerate(self.reps):
            while w not in self.finished and not (block and self.results[w]):
                got = rep.take(block)
                if got is None:
                    if block:
                        self.finished.add(w)
                    break
                self.results[w].append(got)
        ready = lambda w: self.results[w] or w in self.finished  # noqa: E731
        while self.pending and all(ready(w) for w in range(len(self.reps))):
            self._write(self.pending.popleft(), [r.popleft() if r else None for r in self.results])
        return bool(self.pending) and len(self.finished) < len(self.reps)

    def _write(self, chunk, parts):
        n_rows, n = len(chunk["op"]), len(self.reps)
        timing = {name: np.full(n_rows, -1, dtype=np.int64)
                  for name in ("intended_ns", "issue_ns", "complete_ns", "result")}
        for w, part in enumerate(parts):
            if part is not None:
                for name, values in zip(timing, part[:4]):
                    timing[name][w::n] = values
        out = {**chunk, **timing}
        issued = timing["issue_ns"] >= 0
        if not issued.all():  # a stopped run: keep the rows that were issued
            out = {name: col[issued] for name, col in out.items()}
        if len(out["op"]):
            self.writer.write(out)
            self.summary.add(out)
            for consumer in self.consumers:
                consumer.add(out)
        self.done += len(out["op"])
