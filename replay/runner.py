"""Running a replay: `replay` checks the trace, the options and the target and plans the run;
`_run` starts the engines, streams the chunks through them and the results out to a Parquet
file and a summary. Python prepares, Rust runs. Each concern has its module: replay.options,
replay.sources, replay.engines, replay.merger, replay.output, replay.progress,
replay.timelimit and replay.signals.
"""
import gc
import os
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa

from analysis.summary import RunSummary
from analysis.summary import warm_up as summary_warm_up
from replay import __version__, calibrate, remap
from replay.engines import null_target, start_engines, start_together
from replay.merger import Merger, pieces
from replay.options import RunOptions, Timing, check_options
from replay.output import check_room, close_results, default_output, open_results, recover
from replay.progress import PROGRESS_S, Ticker
from replay.signals import StopSignals, signum_of
from replay.sources import GeneratorSource, TraceSource, check_causal, check_trace, open_source
from replay.targets import scratch_target
from replay.timelimit import Deadline, TimeUp
from traces.errors import ReplayError, TargetError
from traces.outputs import check_output
from traces.schema import Op
from traces.targets import Target, check_safe_to_write, inspect_target

# What callers of the runner use; the rest lives in the modules named above.
__all__ = ["GeneratorSource", "PROGRESS_S", "RunOptions", "RunOutcome", "TraceSource", "null_target",
           "recover", "replay"]


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
    signum: int | None = None  # the stop signal that came during it (SIGINT, SIGTERM, SIGHUP)


@dataclass
class _Plan:
    """What `replay` settled before any I/O, for `_run` to carry out."""

    source: TraceSource | GeneratorSource
    target: Target
    mapping: remap.Mapping
    options: RunOptions
    output: Path
    writes: bool  # the run writes to the target (not --read-only, and the trace writes)
    notices: list
    progress: Callable | None = None
    consumers: tuple = ()
    extra: dict = field(default_factory=dict)  # merged into the results' metadata
    host_ns: np.ndarray | None = None  # causal timing: the replayer's own time per I/O

    @property
    def causal(self) -> bool:
        return self.options.timing == Timing.causal


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
    not an interruption. A stop signal that comes after the last I/O keeps every row (not
    interrupted) and is still in the outcome's `signum`, so that a caller stops too. Returns the outcome; raises ReplayError subclasses for setup problems.
    """
    with StopSignals() as stops:
        options = options or RunOptions()
        # Every check that needs no target comes before anything is opened or written.
        check_options(options)
        notices = [] if notices is None else notices
        source = open_source(trace)
        inputs = [(source.path, "the trace being replayed")] if isinstance(source, TraceSource) else []
        tgt = None if target is None else inspect_target(str(target))  # reads only
        if output is not None:
            check_output(output, inputs=inputs, target=tgt, force=options.force)
        check_trace(source, options)
        if options.timing == Timing.causal:
            check_causal(source, options)
        scan = source.scan
        writes = scan.writes and not options.read_only
        tgt, cleanup = (tgt, None) if tgt is not None else _scratch(options, scan.span, writes, notices)
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
            plan = _Plan(source, tgt, mapping, options, Path(output) if output else default_output(source.stem, tgt),
                         writes, notices, progress, consumers, metadata or {})
            if plan.causal and options.calibrate:
                plan.host_ns = calibrate.for_run(tgt, options.engine, writes, notices)
            stops.defer = True  # from here a signal stops the engines, never a write or the clean-up
            outcome = _run(plan, stops)
        finally:
            stops.defer = True
            if cleanup:
                cleanup()
    if outcome.signum is None and stops.received is not None:
        # It came after the last I/O: every row is kept, but the caller was asked to stop.
        outcome.signum = stops.received
    return outcome


def _scratch(options: RunOptions, span: int, writes: bool, notices) -> tuple[Target, Callable | None]:
    """The target when none is given, and how to remove it afterwards: a scratch file sized
    to the trace, or the null engine's stand-in."""
    if options.engine == "null":
        return null_target(span), None
    tgt, cleanup = scratch_target(span, writes=writes)
    notices.append(f"no target given: replaying on a scratch file of {remap.human_bytes(tgt.size)} "
                   f"({tgt.path}), removed afterwards")
    return tgt, cleanup


def _run(plan: _Plan, stops: StopSignals) -> RunOutcome:
    """Carry out the plan: start the engines, issue the chunks and write their results, to
    the end of the trace, the time limit or a stop signal."""
    options = plan.options
    # A run to a time limit (a generator with no end) has no row count to check.
    check_room(plan.output, None if options.time_limit_s else plan.source.scan.rows)
    summary_warm_up()
    reps, engine, direct = start_engines(plan.target, options, plan.writes, _buffer_length(plan), plan.notices)
    beside = _made_beside(options, engine)
    try:
        writer, columns = open_results(plan.output, plan.source.column_names,
                                       _metadata(plan, engine, direct), plan.notices, options.force, beside=beside)
    except ReplayError:
        for rep in reps:
            rep.stop()
        raise
    merger = Merger(reps, writer, RunSummary(), plan.consumers, summarising=beside)
    deadline = Deadline(options.time_limit_s, stops)
    ticker = Ticker(plan.progress, merger, plan.source.scan.rows)
    feed = _Feed(plan, merger)
    gc.disable()  # the run allocates few objects; collector passes only steal the engine's CPU
    try:
        stop = _issue(feed.chunks(columns), merger, deadline, ticker, options.start_ns)
        stats = [rep.join() for rep in reps]
    except BaseException as e:
        deadline.cancel()
        _stop_and_join(reps)
        path = close_results(writer, merger, lambda summary: {
            "interrupted": True, "rows_done": merger.done, "trace": plan.source.describe(merger.done),
            "summary": summary.to_dict()}, e)
        if isinstance(e, OSError):
            raise ReplayError(f"{e}; the {merger.done} I/Os done so far are in {path}") from None
        raise
    finally:
        ticker.stop()
        gc.enable()
    return _finish(plan, engine, writer, merger, stats, feed.aligned, stop)


def _made_beside(options: RunOptions, engine: str) -> bool:
    """Whether the results' Parquet file and their summary are made while the run goes, or
    from the journal at close. As fast as possible on a device, the engine's threads and the
    kernel's take every CPU, and what the Python thread spends comes out of the I/Os. The
    encoding (89 against 31 ns a row written, journal included): IOPS made so against encoded
    beside, 4 rounds alternating, medians 0.99-1.05x (1.01x over 8 rows: zram QD32 and a loop
    device over /dev/shm at QD 4, 32 and 128, random reads and 70/30); the close then takes
    ~60 ns a row more (71 against 10). The summary (~10 ns a row): 10 rounds alternating, per
    round 0.995-1.016x on zram QD32 and that loop device at QD 32 and 128 (1.008x on average
    over 5 rows). Timed runs leave the CPUs idle between I/Os, and the null engine is one
    thread, so their files are done when the run is."""
    return options.timing != Timing.afap or engine == "null"


def _buffer_length(plan: _Plan) -> int:
    """The engines' buffer per I/O: the longest read or write, in whole pages, with room to
    align it to the target's blocks on both ends."""
    return max(4096, -(-plan.source.buffer_length // 4096) * 4096 + 2 * plan.target.logical_block_size)


def _metadata(plan: _Plan, engine: str, direct: bool) -> dict:
    """The results file's metadata: the trace, the target and how it was replayed."""
    options = plan.options
    return {
        **plan.extra,
        "name": plan.source.name,
        "kind": "results",
        "trace": plan.source.describe(0),
        "target": asdict(plan.target),
        "run": {
            "engine": engine, "mode": Timing(options.timing).value,
            **({"think_scale": options.think_scale, "heuristic": options.heuristic,
                "host_cost_ns": None if plan.host_ns is None else plan.host_ns.tolist()}
               if plan.causal else {}),
            "speed": options.speed, "qd": options.qd, "max_inflight": options.max_inflight,
            "workers": options.workers, "remap": plan.mapping.mode, "read_only": options.read_only,
            "data": options.data, "direct": direct, "time_limit_s": options.time_limit_s,
            # What issue_ns times (README: Results); results without the key timed io_uring's
            # I/Os when the submitting call returned.
            "issue_ns": "system call start",
            "started": datetime.now(timezone.utc).isoformat(),
        },
        "host": platform.node(), "kernel": platform.release(),
        "versions": {"tracereplay": __version__, "pyarrow": pa.__version__, "numpy": np.__version__},
    }


class _Feed:
    """The source's chunks as the engines take them: cut into pieces (merger.pieces), with
    causal timing's parents and think times, only the reads with --read-only, and remapped
    onto the target. `aligned` counts the I/Os aligned to its blocks so far."""

    def __init__(self, plan: _Plan, merger: Merger):
        self.plan, self.merger = plan, merger
        self.aligned = 0
        self.annotator = None
        if plan.causal:
            from analysis.causal import Annotator, sleeps_of

            self.annotator = Annotator(plan.options.heuristic, host_ns=plan.host_ns,
                                       sleeps=sleeps_of(plan.source.metadata))

    def chunks(self, columns):
        options = self.plan.options
        for chunk in pieces(self.plan.source.chunks(columns, options.chunk_rows), options, self.merger):
            if self.annotator is not None:  # parents and think times, streaming in row order
                chunk["causal"] = self.annotator.add(chunk)
            if options.read_only:
                reads = chunk["op"] == Op.READ
                chunk = {name: col[reads] for name, col in chunk.items()}
            chunk["offset"], chunk["length"], n = remap.apply(
                self.plan.mapping, chunk["offset"], chunk["length"], chunk["op"])
            self.aligned += n
            yield chunk


def _issue(chunks, merger: Merger, deadline: Deadline, ticker: Ticker, start_ns) -> BaseException | None:
    """Push every chunk to the workers and write their results until they are done. A stop
    signal or the time limit stops the engines, whose finished rows are still written: that
    stop (a KeyboardInterrupt or TimeUp) is returned; None when the run went to its end."""
    reps = merger.reps
    stop = None
    try:
        for chunk in chunks:
            deadline.start()
            if not ticker.running:
                ticker.start(start_together(reps, start_ns))
            deadline.wait(merger.push, chunk)
            merger.collect(block=False)
        for rep in reps:
            rep.close()
        while deadline.wait(merger.collect, True):
            pass
    except (KeyboardInterrupt, TimeUp) as e:
        deadline.cancel()
        stop = e
        for rep in reps:
            rep.stop()
        while merger.collect(block=True):
            pass
    deadline.cancel()
    return stop


def _stop_and_join(reps) -> None:
    """Stop every worker and wait for it, whatever went wrong: no I/O outlives the run."""
    for rep in reps:
        rep.stop()
    for rep in reps:
        try:
            rep.join()  # its error, if any, is the one being handled or came after it
        except BaseException:
            pass


def _finish(plan: _Plan, engine: str, writer, merger: Merger, stats, aligned: int, stop) -> RunOutcome:
    """Close the results with the run's end in their metadata, and say how it went."""
    time_up = isinstance(stop, TimeUp)
    signum = signum_of(stop) if isinstance(stop, KeyboardInterrupt) else None
    # Stopping at the time limit is how such a run ends, so the engines' "stopped" is no
    # interruption then; Ctrl-C is.
    interrupted = signum is not None or (not time_up and any(s["interrupted"] for s in stats))
    if aligned:
        plan.notices.append(f"aligned {aligned} I/Os to the target's {plan.target.logical_block_size}-byte blocks")
    engine_cpu_s = sum(s["cpu_ns"] for s in stats) / 1e9
    path = close_results(writer, merger, lambda summary: {
        "interrupted": interrupted, "rows_done": merger.done,
        "rows_issued": sum(s["rows_issued"] for s in stats),
        "time_limited": time_up, "trace": plan.source.describe(merger.done),
        "aligned_ios": aligned,
        "engine_cpu_s": engine_cpu_s,
        "summary": summary.to_dict()})
    return RunOutcome(path, merger.summary, interrupted, plan.target, merger.done, plan.notices, time_up,
                      engine_cpu_s, engine, signum if interrupted else None)
