"""`replay import FILE... -o OUT.parquet` and `replay export TRACE --format F -o OUT`."""
import shlex
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from replay.commands import fail
from traces import formats
from traces.errors import ReplayError


# The choices come from the one registry of formats (traces.formats.NAMES and WRITERS).
ImportFormat = Enum("ImportFormat", {name: name for name in formats.NAMES}, type=str)
ExportFormat = Enum("ExportFormat", {name: name for name in formats.WRITERS}, type=str)


class Event(str, Enum):
    queue = "queue"
    issue = "issue"


class Asu(str, Enum):
    devices = "devices"
    concat = "concat"


class TimeUnit(str, Enum):
    s = "s"
    ms = "ms"
    us = "us"
    ns = "ns"


class _Progress:
    """A bar of input bytes on stderr for imports longer than a second, on a terminal only."""

    def __init__(self):
        import time

        self.started, self.clock, self.bar, self.task = time.monotonic(), time.monotonic, None, None

    def __call__(self, done, total):
        if self.bar is None:
            if self.clock() - self.started < 1.0 or not sys.stderr.isatty():
                return
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("importing"), BarColumn(), DownloadColumn(),
                                TimeRemainingColumn(), console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("import", total=total or None)
        self.bar.update(self.task, completed=done)

    def close(self):
        if self.bar is not None:
            self.bar.stop()


def import_(
    files: Annotated[List[Path], typer.Argument(
        help="Trace files to import, all in the same format; .gz, .xz and .zst files are read "
             "directly. Several files are merged by time, each becoming its own device number "
             "where the format has no device of its own.")],
    output: Annotated[Path, typer.Option(
        "--output", "-o",
        help="The Parquet trace to write. It appears only when the whole import succeeded; a "
             "failed import leaves nothing behind. An existing directory instead imports each file "
             "into its own trace there (DIR/NAME.parquet), in parallel, and adds them to "
             "DIR/catalog.parquet.")],
    format: Annotated[Optional[ImportFormat], typer.Option(
        "--format",
        help="The input format (docs/formats.md says what each one is). Without it, the format "
             "is recognised from the first file's content; disksim input also needs "
             "--time-unit.")] = None,
    event: Annotated[Event, typer.Option(
        help="For blktrace and blkparse input: the event that stands for an I/O, queue (Q, as the "
             "application asked) or issue (D, as the device saw it).")] = Event.issue,
    asu: Annotated[Asu, typer.Option(
        help="For UMass SPC input: devices makes each ASU its own device number; concat lays the "
             "ASUs one after another in one address space.")] = Asu.devices,
    device: Annotated[Optional[str], typer.Option(
        help="For Alibaba, Tencent and DiskSim input: keep only this device_id, VolumeID or devno. "
             "Without it, every device is kept and numbered in the device column.")] = None,
    time_unit: Annotated[Optional[TimeUnit], typer.Option(
        "--time-unit",
        help="For DiskSim input, required: the unit of its times, ms for DiskSim, ns for MQSim (or "
             "us, s).")] = None,
    drop_outliers: Annotated[bool, typer.Option(
        "--drop-outliers",
        help="Leave out lone records whose time is more than 90 days from the records around them "
             "(a damaged timestamp), and list them in the trace's metadata. Without it such a "
             "record stops the import, naming its line.")] = False,
    name: Annotated[Optional[str], typer.Option(
        help="The trace's name in its metadata. Default: the first input file's name without its "
             "extensions.")] = None,
    cluster: Annotated[Optional[str], typer.Option(
        "--cluster", envvar="RAY_ADDRESS",
        help="With -o DIR: import the files as Ray tasks on the cluster at this address (HOST:PORT "
             "of the head, auto or local as for `replay traces ls`; RAY_ADDRESS also sets it). "
             "Every node must see the inputs and DIR at the same paths.")] = None,
    jobs: Annotated[Optional[int], typer.Option(
        "--jobs", "-j", min=1,
        help="With -o DIR and no --cluster: how many files are imported at once, each in its own "
             "process (default: one per core).")] = None,
    force: Annotated[bool, typer.Option(
        "--force",
        help="Replace the -o file if it exists. Without it an existing file is refused, and never "
             "is one that another process is writing.")] = False,
):
    """Import traces in a public or tool format into a validated Parquet trace.

    The records are checked as they are read: a malformed line stops the import with its
    file and line number, and no output is written. An input without any I/O is refused.
    Example: replay import hm_0.csv.gz -o hm_0.parquet
    """
    from traces.convert import import_trace

    options = {"event": event.value, "asu": asu.value, "device": device, "name": name,
               "time_unit": time_unit.value if time_unit else None, "drop_outliers": drop_outliers}
    command = shlex.join(["replay", *sys.argv[1:]])
    if output.is_dir():
        _import_each(files, output, format.value if format else None, options, command, cluster, jobs)
        return
    progress = _Progress()
    try:
        out, rows = import_trace(files, output, format.value if format else None, options,
                                 command=command, progress=progress, force=force)
    except ReplayError as e:
        progress.close()
        fail(e)
    finally:
        progress.close()
    typer.echo(f"imported {rows} I/Os into {out}")
    if drop_outliers:
        from traces.trace import open_trace

        dropped = open_trace(out).metadata.get("dropped_outliers")
        if dropped:
            typer.echo(f"left out {dropped['count']} record(s) with an outlying time "
                       f"({', '.join(dropped['first'])}); the trace's metadata lists them")


def _import_each(files, directory: Path, fmt, options, command, cluster, jobs):
    """`replay import FILE... -o DIR`: each file into DIR/NAME.parquet, in parallel (local
    processes or Ray tasks), one progress line per file; then DIR's catalog gets their rows.
    A failed file is named with its error, the others finish, and the exit code is 1."""
    from replay.cluster import run_each
    from analysis.catalog import CATALOG_NAME, import_file, update_catalog

    if options.get("name"):
        fail(ReplayError("--name names one trace; with -o DIR each file's trace is named after the file"))
    outputs = [directory / f"{f.name.split('.')[0]}.parquet" for f in files]
    seen = {}
    for f, out in zip(files, outputs):
        if out in seen:
            fail(ReplayError(f"{seen[out]} and {f} would both be imported into {out}; import them separately"))
        seen[out] = f
    work = [{"input": str(f), "output": str(out), "format": fmt, "options": options, "command": command}
             for f, out in zip(files, outputs)]
    rows, failed = [], []
    try:
        for k, done in enumerate(run_each(import_file, work, cluster, jobs), 1):
            source = files[done.index]
            if done.error is not None:
                failed.append(source)
                typer.echo(f"[{k}/{len(files)}] {source}: failed: {done.error}", err=True)
            else:
                rows.append(done.value)
                typer.echo(f"[{k}/{len(files)}] {source}: {done.value['ios']:,} I/Os into "
                           f"{outputs[done.index]}", err=True)
    except ReplayError as e:
        fail(e)
    finally:
        if rows:
            update_catalog(rows, directory / CATALOG_NAME)
    typer.echo(f"imported {len(rows)} of {len(files)} files into {directory} "
               f"(catalog: {directory / CATALOG_NAME})")
    if failed:
        typer.echo(f"{len(failed)} failed: {', '.join(map(str, failed))}", err=True)
        raise typer.Exit(1)


def export(
    trace: Annotated[str, typer.Argument(
        help="Trace file, or the name of a trace in the bundled library (for example: demo).")],
    format: Annotated[ExportFormat, typer.Option(
        "--format",
        help="fio writes an iolog v3 for fio --read_iolog (each device is a file, tracereplay.img "
             "by default: send it to a drive with fio's --replay_redirect); blktrace writes binary "
             "records for blkparse and btreplay; csv writes a header of column names and one I/O "
             "per line; oraclegeneral writes libCacheSim's records (reads and writes, the 512-byte "
             "sector as the object) for its cachesim.")],
    output: Annotated[Path, typer.Option(
        "--output", "-o",
        help="The file to write. It appears only when the export succeeded.")],
    force: Annotated[bool, typer.Option(
        "--force",
        help="Replace the -o file if it exists. Without it an existing file is refused, and never "
             "is one that another process is writing.")] = False,
):
    """Export a trace for other tools: fio, blktrace or CSV.

    fio iologs keep microseconds, op, offset and length; CSV keeps every column.
    Example: replay export demo --format fio -o demo.iolog
    """
    from traces.convert import export_trace

    try:
        out = export_trace(trace, format.value, output, force=force)
    except ReplayError as e:
        fail(e)
    typer.echo(f"exported {trace} as {format.value} to {out}")
