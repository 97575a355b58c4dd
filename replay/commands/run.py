"""`replay run TRACE [TARGET]`: replay a trace on a drive or a file and summarise it."""
import json
import signal
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from analysis import causal
from replay import signals
from replay.commands import (Notes, PowerColumns, PowerLog, PowerStart, PowerTimeUnit, Progress,
                             fail, power_layout, refusing)
from replay.options import Engine, Timing
from replay.remap import MODES as REMAP_MODES
from traces.errors import ReplayError


# The choices come from the modules that own them (replay.options, analysis.causal, replay.remap).
Heuristic = Enum("Heuristic", {name: name for name in causal.HEURISTICS}, type=str)
Remap = Enum("Remap", {name: name for name in REMAP_MODES}, type=str)


# Exit statuses of `replay run`, as docs/replaying.md lists them.
EXIT_IO_FAILED = 3  # the run finished, but some I/Os failed (their -errno is in the results)
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT); 128 + the signal: 143 SIGTERM, 129 SIGHUP. I/Os done are kept


def _timing(timing: Timing | None, afap: bool) -> Timing:
    """The one place --afap, the documented shorthand of --timing afap, is read."""
    if afap and timing not in (None, Timing.afap):
        fail(ReplayError(f"--afap and --timing {timing.value} exclude each other: give one"))
    return Timing.afap if afap else timing or Timing.original


def run(
    trace: Annotated[str, typer.Argument(
        help="Trace file, or the name of a trace in the bundled library (for example: demo).")],
    target: Annotated[Optional[str], typer.Argument(
        help="Block device or regular file to replay on. Without it, a scratch file sized to the "
             "trace is made in the temporary directory and removed afterwards.")] = None,
    speed: Annotated[float, typer.Option(
        help="Timing scale for original timing, a finite number above 0: 2 replays twice as fast, "
             "0.5 at half speed.")] = 1.0,
    afap: Annotated[bool, typer.Option(
        "--afap",
        help="Shorthand for --timing afap: ignore the trace's timing and issue as fast as "
             "possible with --qd I/Os in flight.")] = False,
    timing: Annotated[Optional[Timing], typer.Option(
        help="original: each I/O at its captured time over --speed (the default); afap: as --afap; "
             "causal: each I/O when the I/Os it waited for in the capture have completed on "
             "TARGET, plus the application's own time in between, so the replay runs as the "
             "application would on TARGET (needs a trace with pid and latency_ns, as replay "
             "capture makes).",
        show_default=False)] = None,
    think_scale: Annotated[float, typer.Option(
        help="With --timing causal: multiply the application's own time between I/Os by this (0.5: "
             "a CPU twice as fast).")] = 1.0,
    heuristic: Annotated[Heuristic, typer.Option(
        help="With --timing causal: how each I/O's parents are inferred: chains (the last "
             "completion of its own process; writeback and journal threads each one process) "
             "recent (the last completion of any process within 1 ms before it), or hybrid, the "
             "default (chains, and the last completion of any process when later than the chain's "
             "and at most 2 ms before, 10 ms after a journal, writeback, flush or FUA I/O or "
             "before a journal I/O, any time before a writeback I/O).")] = \
        Heuristic(causal.DEFAULT_HEURISTIC),
    calibrate: Annotated[bool, typer.Option(
        help="With --timing causal on a block device, as root: first measure the replayer's own "
             "time per I/O there (a chain of 360 probe I/Os on its first 2 MiB, traced at the "
             "block layer) and take it off each think time, which the capture measured with the "
             "application's own submission in it.")] = True,
    qd: Annotated[int, typer.Option(
        help="I/Os in flight with --afap, from 1 to 32768 (the engine's limit).")] = 32,
    max_inflight: Annotated[int, typer.Option(
        help="With original timing, the most I/Os in flight, from 1 to 32768; when the target "
             "falls behind, I/Os wait and their lateness is recorded.")] = 1024,
    workers: Annotated[int, typer.Option(
        help="Spread the I/Os over this many threads, each with its own engine and "
             "--qd/--max-inflight (row i goes to worker i mod N): the reviews' '32 threads at QD1' "
             "is --afap --workers 32 --qd 1. From 1 to 256: each worker holds up to 17 MB of "
             "buffers, and more workers than that only take turns on the CPUs.")] = 1,
    engine: Annotated[Optional[Engine], typer.Option(
        help="I/O engine. The default is io_uring, or psync, with a notice, on drivers that run "
             "each I/O on the submitting CPU (zram, brd), where io_uring would hand every I/O to a "
             "kernel worker thread. io_uring falls back to psync, with a notice, where it is "
             "refused; null does no I/O (for testing the pipeline).",
        show_default=False)] = None,
    remap: Annotated[Remap, typer.Option(
        help="What to do when the trace spans more than the target holds: fail (refuse), wrap "
             "(offset modulo the size) or scale (proportionally).")] = Remap.fail,
    read_only: Annotated[bool, typer.Option(
        "--read-only",
        help="Replay only the reads; writes, flushes and discards are skipped and "
             "counted.")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run",
        help="Check the trace, the target and the mapping, then stop without issuing any "
             "I/O.")] = False,
    data: Annotated[str, typer.Option(
        help="What writes carry: random (incompressible), zeros, or compressible:PCT (PCT percent "
             "zeros, 0 to 100).")] = "random",
    destroy_data: Annotated[bool, typer.Option(
        "--destroy-data",
        help="Write to a block device or disk image even though it looks in use (partitioned, "
             "holding a filesystem, behind a loop device). Its data WILL be destroyed.")] = False,
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o",
        help="Results file (Parquet). Default: TRACE-TARGET-TIMESTAMP.parquet in the current "
             "directory.")] = None,
    force: Annotated[bool, typer.Option(
        "--force",
        help="Replace the -o file if it exists. Without it an existing file is refused, and never "
             "is one that another process is writing.")] = False,
    json_out: Annotated[bool, typer.Option(
        "--json",
        help="Print the summary as JSON, with fio's key names, instead of a table.")] = False,
    power_log: PowerLog = None,
    power_columns: PowerColumns = None,
    power_time_unit: PowerTimeUnit = None,
    power_start: PowerStart = None,
    plan: Annotated[Optional[Path], typer.Option(
        "--plan",
        help="Replay on several hosts of a Ray cluster (needs --cluster): a TOML or JSON file "
             "mapping the trace's device values, or shares of its rows, to (host, target) pairs; "
             "see docs/cluster.md. -o is then a new results directory.")] = None,
    cluster: Annotated[Optional[str], typer.Option(
        "--cluster",
        help="With --plan: the Ray cluster's address, HOST:PORT of its head (as `ray start --head` "
             "prints it), auto or local (see docs/cluster.md).")] = None,
):
    """Replay TRACE on TARGET and record the intended, issue and completion time of every I/O.

    Writing to a drive destroys its data. Exit status: 0 when every I/O succeeded, 2 when
    the input or an option is refused (nothing is written), 3 when the run finished but some
    I/Os failed (counted and named by errno), 128 + the signal when interrupted, the I/Os done
    kept: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP.
    Example: replay run oltp /dev/sdc --speed 2
    """
    from replay.runner import RunOptions, replay

    options = RunOptions(speed=speed, timing=_timing(timing, afap).value, qd=qd, max_inflight=max_inflight,
                         workers=workers, engine=engine and engine.value, remap=remap.value,
                         read_only=read_only, dry_run=dry_run, data=data, destroy_data=destroy_data,
                         force=force,
                         think_scale=think_scale, heuristic=heuristic.value, calibrate=calibrate)
    try:
        layout = power_layout(power_columns, power_time_unit, power_start)
    except ReplayError as e:
        fail(e)
    if plan is not None or cluster is not None:
        if power_log is not None:
            fail(ReplayError("--power-log measures a run on this host; give it without --plan"))
        from replay.commands.cluster import run_on_cluster

        return run_on_cluster(trace, target, options, plan, cluster, output, json_out)
    progress = Progress()
    notices = Notes(progress)
    started = time.monotonic()
    with refusing(progress, "the first I/O"):  # after it, the runner keeps what was done
        outcome = replay(trace, target, options, output=output, progress=progress, notices=notices)
    if dry_run:
        typer.echo(f"dry run: the trace and {outcome.target.path} check out; nothing was issued")
        return
    report = outcome.summary.to_dict()
    watts = _power(power_log, layout, outcome, report["tracereplay"]) if power_log else None
    if json_out:
        report["tracereplay"].update(output=str(outcome.output), interrupted=outcome.interrupted,
                                     notices=notices, **({"power": watts} if power_log else {}))
        typer.echo(json.dumps(report, indent=2))
    else:
        typer.echo(outcome.summary.format_table())
        if watts:
            mb, io = watts["mb_per_s_per_w"], watts["iops_per_w"]
            typer.echo(f"power: {watts['average_w']:.2f} W average over "
                       f"{watts['covered_share'] * 100:.0f} % of the run, "
                       + ("no efficiency at 0 W" if mb is None else
                          f"{mb:,.1f} MB/s/W, {io:,.0f} IOPS/W") + f" ({power_log})")
        typer.echo(f"results: {outcome.output}")
    if outcome.interrupted:
        by = signals.name(outcome.signum or signal.SIGINT)
        typer.echo(f"interrupted by {by} after {time.monotonic() - started:.1f} s: {outcome.rows} I/Os done "
                   f"are saved in {outcome.output}, marked interrupted", err=True)
    elif outcome.signum:
        typer.echo(f"{signals.name(outcome.signum)} came as the run ended: all {outcome.rows} I/Os are "
                   f"saved in {outcome.output}", err=True)
    total = outcome.summary.total()
    if total.errors:
        from analysis.summary import errno_name

        by = ", ".join(f"{errno_name(code)} {n}" for code, n in sorted(total.errno_counts.items()))
        typer.echo(f"{total.errors} of {total.ios} I/Os failed ({by}); IOPS and MB/s count only those "
                   f"that succeeded, and each failure's -errno is in the result column of {outcome.output}",
                   err=True)
    if outcome.interrupted or outcome.signum:
        raise typer.Exit(signals.exit_status(outcome.signum or signal.SIGINT))
    if total.errors:
        raise typer.Exit(EXIT_IO_FAILED)


def _power(path, layout: dict, outcome, summary: dict) -> dict:
    """The run's power from the meter's log at `path`, aligned by the wall-clock start in its
    results file's metadata; a log that does not overlap the run, or cannot be read, ends the
    command as bad input, the results file kept."""
    from analysis import power
    from traces.trace import open_trace

    started = open_trace(outcome.output).metadata["run"]["started"]
    try:
        log = power.read_log(path, **layout)
        found = power.measure(log, started, summary)
        if found is None:
            start = power.parse_when(started)
            raise power.no_overlap(log, start, start + summary["duration_ns"] / 1e9)
    except ReplayError as e:
        fail(f"{e}; the run's results are kept in {outcome.output}")
    return found
