"""`replay capture DEVICE -o NAME.parquet [-- COMMAND ...]`: trace a block device into a trace."""
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from replay.errors import ReplayError


class Backend(str, Enum):
    auto = "auto"
    tracefs = "tracefs"
    blktrace = "blktrace"


def capture(
    device: Annotated[str, typer.Argument(help="Block device to trace, for example /dev/sdb. A partition is traced through its disk, with the disk's offsets.")],
    command: Annotated[Optional[list[str]], typer.Argument(help="Command to run while tracing, after `--`; tracing stops when it exits.")] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="Trace file to write (Parquet). It appears only when the capture succeeds.")] = ...,
    duration: Annotated[Optional[float], typer.Option(help="Stop after this many seconds. Without it and without a command, tracing runs until Ctrl-C.")] = None,
    backend: Annotated[Backend, typer.Option(help="auto uses blktrace where it can open its relay files and tracefs elsewhere (kernel lockdown); tracefs or blktrace forces one.")] = Backend.auto,
    strict: Annotated[bool, typer.Option("--strict", help="Treat lost events as an error: no trace is written and the exit code is 2.")] = False,
    name: Annotated[Optional[str], typer.Option(help="Name stored in the trace's metadata; default: the output file's name without .parquet.")] = None,
):
    """Trace DEVICE's block I/O while COMMAND runs, for --duration seconds, or until Ctrl-C.

    Every request keeps its issue time, latency, op, flags, offset, length and the pid and
    command that queued it. Lost events are reported and stored in the trace's metadata.
    Needs root. Example: replay capture /dev/loop0 -o copy.parquet -- cp -r photos /mnt/
    """
    from traces.capture import capture as run_capture

    notices = []

    def started(chosen):
        until = "COMMAND exits" if command else (f"{duration:g} s" if duration else "Ctrl-C")
        typer.echo(f"tracing {device} with {chosen} until {until}", err=True)

    try:
        result = run_capture(device, output, command=command or None, duration=duration,
                             backend=backend.value, strict=strict, name=name, notices=notices,
                             on_start=started)
    except ReplayError as e:
        for n in notices:
            typer.echo(f"note: {n}", err=True)
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    for n in notices:
        typer.echo(f"note: {n}", err=True)
    src = result.metadata["source"]
    typer.echo(f"captured {result.rows} I/Os from {device} with {result.backend} "
               f"({result.lost_events} events lost): {result.output}")
    if result.interrupted:
        typer.echo("interrupted: the trace holds the I/O up to the interruption", err=True)
        raise typer.Exit(130)
    if result.command_status:
        typer.echo(f"note: {src['traced_command']} exited with status {result.command_status}; "
                   "the trace holds its I/O up to its end", err=True)
        raise typer.Exit(1)
