"""One module per command group; replay.cli registers them. Here: what they share."""
import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer

from replay import signals
from traces.errors import ReplayError

__all__ = ["Notes", "Progress", "PowerColumns", "PowerLog", "PowerStart", "PowerTimeUnit", "emit",
           "fail", "power_layout", "refusing", "bench", "capture", "cluster", "compare",
           "convert", "library", "recover", "report", "run", "suite", "verdict"]


# --power-log and its companions, the same on `replay run` and `replay bench`.
PowerLog = Annotated[Optional[Path], typer.Option(
    "--power-log",
    help="A power meter's log, a CSV of timestamps and watts (a Quarch module's stream or Power "
         "Studio export as is: \"Time us\" and \"Tot uW\"), read after the runs and aligned to "
         "each by wall-clock time: the results get each run's average power, MB/s/W and IOPS/W. "
         "A log that overlaps no run is refused.",
    metavar="FILE", show_default=False)]
PowerColumns = Annotated[Optional[str], typer.Option(
    "--power-columns",
    help="The power log's time and watts columns by header name, for other meters, for example "
         "--power-columns stamp,watts (units from a header's last word: s, ms, us, ns; W, mW, "
         "uW; default s and W).",
    metavar="TIME,WATTS", show_default=False)]
PowerTimeUnit = Annotated[Optional[str], typer.Option(
    "--power-time-unit",
    help="The power log's time unit (s, ms, us or ns) where its header does not name it.",
    show_default=False)]
PowerStart = Annotated[Optional[str], typer.Option(
    "--power-start",
    help="When the power log's time 0 was, as Unix seconds or ISO 8601 (local time without a "
         "zone), for logs whose times count from the recording's start, as Quarch's do; without "
         "it times are Unix time or ISO 8601 instants.",
    metavar="WHEN", show_default=False)]


def power_layout(columns: str | None, time_unit: str | None, start: str | None) -> dict:
    """--power-columns, --power-time-unit and --power-start as analysis.power.read_log's
    columns, time_unit and start, checked; ReplayError names the option that is wrong."""
    from analysis import power

    parsed = tuple(c.strip() for c in columns.split(",")) if columns else None
    power.check_layout(parsed, time_unit)
    return {"columns": parsed, "time_unit": time_unit,
            "start": power.parse_when(start) if start else None}


def fail(error) -> NoReturn:
    """The one way a command stops on bad input: one line on stderr, exit status 2."""
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(2)


@contextlib.contextmanager
def refusing(progress, before: str):
    """Around a command's work: a refusal (ReplayError) ends it as `fail` does, and a stop
    signal before `before` (nothing done yet) with one line and 128 + the signal; the
    progress bar is taken down either way."""
    try:
        yield
    except ReplayError as e:
        progress.close()
        fail(e)
    except KeyboardInterrupt as e:
        progress.close()
        signum = signals.signum_of(e)
        typer.echo(f"interrupted by {signals.name(signum)} before {before}: nothing was replayed "
                   "or written", err=True)
        raise typer.Exit(signals.exit_status(signum)) from None
    finally:
        progress.close()


def emit(result, json_out: bool) -> None:
    """Print a comparison-like result: its JSON with --json, else its table."""
    typer.echo(json.dumps(result.to_dict(), indent=2) if json_out else result.format_table())


class Progress:
    """A progress bar on stderr when it is a terminal, from the first I/O: `label`, I/Os done
    of the total, time elapsed and left, IOPS. The runner calls it several times a second."""

    def __init__(self, label="replaying"):
        self.label = label
        self.bar = None
        self.task = None

    def __call__(self, done, total, elapsed, label=None):
        self.label = label or self.label
        if self.bar is None:
            if not sys.stderr.isatty():
                return
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)
            from rich.progress import Progress as Bar

            self.bar = Bar(TextColumn("{task.fields[label]}"), BarColumn(), MofNCompleteColumn(),
                           TextColumn("I/Os"), TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                           TextColumn("{task.fields[iops]}"), console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("replay", total=total, iops="", label=self.label)
        self.bar.update(self.task, completed=done, total=total, label=self.label,
                        iops=f"{done / max(elapsed, 1e-9):,.0f} IOPS")

    def echo(self, line):
        """Print a line on stderr, above the bar while it shows."""
        if self.bar is not None:
            self.bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            typer.echo(line, err=True)

    def close(self):
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


class Notes(list):
    """The run's notes, each printed as the runner adds it: those about the set-up (a scratch
    file, an engine fallback) come before the run starts, not after it."""

    def __init__(self, progress):
        super().__init__()
        self.progress = progress

    def append(self, note):
        super().append(note)
        self.progress.echo(f"note: {note}")
