"""One module per command group; replay.cli registers them. Here: what they share."""
import json
from typing import NoReturn

import typer

__all__ = ["emit", "fail", "bench", "capture", "cluster", "compare", "convert", "library", "recover",
           "report", "run", "verdict"]


def fail(error) -> NoReturn:
    """The one way a command stops on bad input: one line on stderr, exit status 2."""
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(2)


def emit(result, json_out: bool) -> None:
    """Print a comparison-like result: its JSON with --json, else its table."""
    typer.echo(json.dumps(result.to_dict(), indent=2) if json_out else result.format_table())
