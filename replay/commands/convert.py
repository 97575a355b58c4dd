"""`replay import FILE... -o OUT.parquet` and `replay export TRACE --format F -o OUT`."""
import shlex
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from replay.commands import fail
from replay.errors import ReplayError


class ImportFormat(str, Enum):
    blktrace = "blktrace"
    fio = "fio"
    blkparse = "blkparse"
    fiu = "fiu"
    msr = "msr"
    umass = "umass"
    alibaba = "alibaba"
    tencent = "tencent"
    csv = "csv"


class ExportFormat(str, Enum):
    fio = "fio"
    blktrace = "blktrace"
    csv = "csv"


class Event(str, Enum):
    queue = "queue"
    issue = "issue"


class Asu(str, Enum):
    devices = "devices"
    concat = "concat"


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
    files: Annotated[List[Path], typer.Argument(help="Trace files to import, all in the same format; .gz, .xz and .zst files are read directly. Several files are merged by time, each becoming its own device number where the format has no device of its own.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The Parquet trace to write. It appears only when the whole import succeeded; a failed import leaves nothing behind.")],
    format: Annotated[Optional[ImportFormat], typer.Option("--format", help="The input format. Without it, the format is recognised from the first file's content.")] = None,
    event: Annotated[Event, typer.Option(help="For blktrace input: the event that stands for an I/O, queue (Q, as the application asked) or issue (D, as the device saw it).")] = Event.issue,
    asu: Annotated[Asu, typer.Option(help="For UMass SPC input: devices makes each ASU its own device number; concat lays the ASUs one after another in one address space.")] = Asu.devices,
    device: Annotated[Optional[str], typer.Option(help="For Alibaba and Tencent input: keep only this device_id or VolumeID. Without it, every device is kept and numbered in the device column.")] = None,
    name: Annotated[Optional[str], typer.Option(help="The trace's name in its metadata. Default: the first input file's name without its extensions.")] = None,
):
    """Import traces in a public or tool format into a validated Parquet trace.

    The records are checked as they are read: a malformed line stops the import with its
    file and line number, and no output is written. Example: replay import hm_0.csv.gz -o hm_0.parquet
    """
    from traces.convert import import_trace

    options = {"event": event.value, "asu": asu.value, "device": device, "name": name}
    command = shlex.join(["replay", *sys.argv[1:]])
    progress = _Progress()
    try:
        out, rows = import_trace(files, output, format.value if format else None, options,
                                 command=command, progress=progress)
    except ReplayError as e:
        progress.close()
        fail(e)
    finally:
        progress.close()
    typer.echo(f"imported {rows} I/Os into {out}")


def export(
    trace: Annotated[str, typer.Argument(help="Trace file, or the name of a trace in the bundled library (for example: demo).")],
    format: Annotated[ExportFormat, typer.Option("--format", help="fio writes an iolog v3 for fio --read_iolog (each device is a file, tracereplay.img by default: send it to a drive with fio's --replay_redirect); blktrace writes binary records for blkparse and btreplay; csv writes a header of column names and one I/O per line.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The file to write. It appears only when the export succeeded.")],
):
    """Export a trace for other tools: fio, blktrace or CSV.

    fio iologs keep microseconds, op, offset and length; CSV keeps every column.
    Example: replay export demo --format fio -o demo.iolog
    """
    from traces.convert import export_trace

    try:
        out = export_trace(trace, format.value, output)
    except ReplayError as e:
        fail(e)
    typer.echo(f"exported {trace} as {format.value} to {out}")
