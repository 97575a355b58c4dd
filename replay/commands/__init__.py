"""One module per command group; replay.cli registers them. Here: what they share."""
import contextlib
import json
import sys
from typing import NoReturn

import typer

from replay import signals
from traces.errors import ReplayError

__all__ = ["Notes", "Progress", "emit", "fail", "refusing", "bench", "capture", "cluster", "compare",
           "convert", "library", "recover", "report", "run", "suite", "verdict"]


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
