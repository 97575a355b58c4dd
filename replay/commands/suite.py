"""`replay suite [TARGET] -o DIR`: the library's captured workloads on one drive, scored as a
review prints them."""
import json
import signal
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from replay import signals
from replay.commands import Notes, Progress, fail, refusing
from replay.commands.run import EXIT_IO_FAILED, Remap
from replay.options import Engine, Timing
from traces.errors import ReplayError

# The suite's target states (replay.bench.suite.STATES), named here so that --help imports no
# runner; a test checks the two agree.
State = Enum("State", {name: name for name in ("empty", "full")}, type=str)


def _names(text: Optional[str]) -> tuple:
    return tuple(n.strip() for n in text.split(",") if n.strip()) if text else ()


def suite(
    target: Annotated[Optional[str], typer.Argument(
        help="Block device or regular file to replay the workloads on; its data WILL be "
             "destroyed. May be left out only with --engine null.")] = None,
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o",
        help="Directory for the results: one Parquet results file per workload and "
             "results.json, the suite's summary and scores, which replay compare, replay verdict "
             "and replay report read as one set. Created if missing; files of the same names are "
             "replaced.", show_default=False)] = None,
    only: Annotated[Optional[str], typer.Option(
        "--only", help="Replay only these workloads, comma separated (for example oltp,blob).",
        show_default=False)] = None,
    skip: Annotated[Optional[str], typer.Option(
        "--skip", help="Leave these workloads out, comma separated.", show_default=False)] = None,
    timing: Annotated[Timing, typer.Option(
        help="How each workload is replayed, as replay run --timing: causal (the default) "
             "predicts the application's own run time on TARGET; original keeps the captured "
             "times; afap issues as fast as possible.")] = Timing.causal,
    state: Annotated[State, typer.Option(
        help="empty: replay on the target as it is; full: first write the whole target with "
             "128 KiB sequential writes, as the Storage Bench's full-drive runs (on a large "
             "drive that takes as long as writing it end to end).")] = State.empty,
    library_dir: Annotated[Optional[Path], typer.Option(
        "--library",
        help="A directory of traces whose captured ones are the workloads (default: the bundled "
             "library; the synthetic demo is never one).", show_default=False)] = None,
    remap: Annotated[Remap, typer.Option(
        help="What to do with a workload that spans more than the target holds: fail (refuse "
             "before anything is written), wrap or scale, as replay run --remap.")] = Remap.fail,
    engine: Annotated[Optional[Engine], typer.Option(
        help="I/O engine, as replay run --engine (default: io_uring, or psync where the "
             "driver runs each I/O on the submitting CPU); null does no I/O.",
        show_default=False)] = None,
    calibrate: Annotated[bool, typer.Option(
        help="With causal timing on a block device, as root: measure the replayer's own time "
             "per I/O on the target before each workload and take it off its think times, as "
             "replay run --calibrate.")] = True,
    destroy_data: Annotated[bool, typer.Option(
        "--destroy-data",
        help="Write to a block device or disk image even though it looks in use (partitioned, "
             "holding a filesystem, behind a loop device). Its data WILL be destroyed.")] = False,
    json_out: Annotated[bool, typer.Option(
        "--json", help="Print results.json instead of the table.")] = False,
):
    """Replay every captured workload of the trace library on TARGET, one after another, and
    print the table a review would: per workload and overall, the predicted run time and its
    ratio to the capture's, the data rate over busy time (idle gaps capped at 25 ms), average
    and p99 access time for reads and writes, and a PCMark-style composite (ours; see
    docs/suite.md).

    Every check replay run makes is made for every workload before anything is written.
    Ctrl-C keeps every workload done and the one it stopped, marked interrupted. Exit status as
    replay run's: 0, 2 when refused, 3 when some I/Os failed, 128 + the signal when interrupted.

    Example: replay suite /dev/sdc -o suite-sdc
    """
    from replay.bench.suite import Suite, SuiteOptions

    if output is None:
        fail(ReplayError("give --output DIR, the directory for the results, for example "
                         "replay suite /dev/sdc -o suite-sdc"))
    progress = Progress()
    notices = Notes(progress)
    options = SuiteOptions(timing=timing.value, only=_names(only), skip=_names(skip), state=state.value,
                           library=library_dir, engine=engine and engine.value, remap=remap.value,
                           calibrate=calibrate, destroy_data=destroy_data)
    # SIGTERM and SIGHUP end the suite as Ctrl-C does.
    with refusing(progress, "the first workload"), signals.StopSignals():
        doc, scores = Suite(target, output, options, progress, notices).run()
    if json_out:
        typer.echo(json.dumps(doc, indent=2))
    elif scores is not None:
        typer.echo(scores.format_table())
    typer.echo(f"results: {output / 'results.json'}", err=json_out)
    failed = [(r["name"], r["summary"]["errors"]) for r in doc["runs"] if r["summary"]["errors"]]
    if doc["interrupted"]:
        typer.echo(f"interrupted: the {len(doc['runs'])} runs done are saved in {output}, the last "
                   "marked interrupted", err=True)
        raise typer.Exit(signals.exit_status(signals.StopSignals.last or signal.SIGINT))
    if failed:
        typer.echo("some I/Os failed (" + ", ".join(f"{n}: {k}" for n, k in failed) + "); each "
                   "failure's -errno is in its results file", err=True)
        raise typer.Exit(EXIT_IO_FAILED)
