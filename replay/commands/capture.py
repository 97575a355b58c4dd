"""`replay capture DEVICE -o NAME.parquet [-- COMMAND ...]`: trace a block device into a trace;
`replay capture recipe NAME [DEVICE] -o OUT [--KNOB VALUE ...]`: capture a real application.
"""
import inspect
import signal
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

from replay import signals
from replay.commands import fail
from traces.errors import ReplayError


class Backend(str, Enum):
    auto = "auto"
    tracefs = "tracefs"
    blktrace = "blktrace"


def capture(
    device: Annotated[str, typer.Argument(
        help="Block device to trace, for example /dev/sdb. A partition is traced through its disk, "
             "with the disk's offsets.")],
    command: Annotated[Optional[list[str]], typer.Argument(
        help="Command to run while tracing, after `--`; tracing stops when it exits.")] = None,
    output: Annotated[Path, typer.Option(
        "--output", "-o",
        help="Trace file to write (Parquet). It appears only when the capture succeeds.")] = ...,
    duration: Annotated[Optional[float], typer.Option(
        help="Stop after this many seconds. Without it and without a command, tracing runs until "
             "Ctrl-C.")] = None,
    backend: Annotated[Backend, typer.Option(
        help="auto uses blktrace where it can open its relay files and tracefs elsewhere (kernel "
             "lockdown); tracefs or blktrace forces one.")] = Backend.auto,
    strict: Annotated[bool, typer.Option(
        "--strict",
        help="Treat lost events as an error: no trace is written and the exit code is 2.")] = False,
    name: Annotated[Optional[str], typer.Option(
        help="Name stored in the trace's metadata; default: the output file's name without "
             ".parquet.")] = None,
    force: Annotated[bool, typer.Option(
        "--force",
        help="Replace the -o file if it exists. Without it an existing file is refused, and never "
             "is one that another process is writing.")] = False,
):
    """Trace DEVICE's block I/O while COMMAND runs, for --duration seconds, or until Ctrl-C.

    Every request keeps its issue time, latency, op, flags, offset, length and the pid and
    command that queued it. Lost events are reported and stored in the trace's metadata.
    Needs root. Example: replay capture /dev/loop0 -o copy.parquet -- cp -r photos /mnt/

    To capture a real application (PostgreSQL, a BLOB store, a file copy, a boot) set up
    and torn down for you, see: replay capture recipe --help
    """
    from traces.capture import capture as run_capture

    notices = []

    def started(chosen):
        until = "COMMAND exits" if command else (f"{duration:g} s" if duration else "Ctrl-C")
        typer.echo(f"tracing {device} with {chosen} until {until}", err=True)

    try:
        result = run_capture(device, output, command=command or None, duration=duration,
                             backend=backend.value, strict=strict, name=name, notices=notices,
                             on_start=started, force=force)
    except ReplayError as e:
        for n in notices:
            typer.echo(f"note: {n}", err=True)
        fail(e)
    for n in notices:
        typer.echo(f"note: {n}", err=True)
    src = result.metadata["source"]
    typer.echo(f"captured {result.rows} I/Os from {device} with {result.backend} "
               f"({result.lost_events} events lost): {result.output}")
    if result.interrupted:
        by = signals.name(result.signal or signal.SIGINT)
        typer.echo(f"interrupted by {by}: the trace holds the I/O up to the interruption", err=True)
        raise typer.Exit(signals.exit_status(result.signal or signal.SIGINT))
    if result.command_status:
        typer.echo(f"note: {src['traced_command']} exited with status {result.command_status}; "
                   "the trace holds its I/O up to its end", err=True)
        raise typer.Exit(1)


# ---------------------------------------------------------------------------------------
# `replay capture recipe NAME ...`: one command per recipe, its knobs as typed options.
# ---------------------------------------------------------------------------------------

class _DeviceOrRecipe(TyperGroup):
    """`replay capture recipe ...` goes to the recipes; anything else is `replay capture DEVICE ...`."""

    def parse_args(self, ctx, args):
        if not args or args[0] != "recipe":
            args = ["device", *args]
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx, args):
        name, command, rest = super().resolve_command(ctx, args)
        # Usage and errors then read "replay capture DEVICE ...", without the hidden name.
        return ("" if name == "device" else name), command, rest


class _Recipes(TyperGroup):
    """One subcommand per recipe of the registry, built when asked for, from its KNOBS."""

    def list_commands(self, ctx):
        from traces.capture.recipes import names

        return names()

    def get_command(self, ctx, name):
        from traces.capture.recipes import RECIPES

        if name not in RECIPES or name not in self.list_commands(ctx):
            return None
        return _recipe_command(name)


def _option_name(knob: str) -> str:
    return "--" + knob.replace("_", "-")


def _recipe_command(name: str):
    from traces.capture.recipes import load

    module = load(name)

    def command(**values):
        _run_recipe(name, module, values)

    params = [
        inspect.Parameter("device", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
            Optional[str], typer.Argument(
                help="Block device to format and trace; its data is destroyed. Without it, a "
                     "scratch loop device over a sparse file in the temporary directory is made "
                     "and removed.")]),
        inspect.Parameter("output", inspect.Parameter.KEYWORD_ONLY, default=..., annotation=Annotated[
            Path, typer.Option(
                "--output", "-o",
                help="Trace file to write (Parquet). It appears only when the recipe succeeds.")]),
        inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY, default=Backend.auto, annotation=Annotated[
            Backend, typer.Option(help="Capture backend, as for replay capture DEVICE.")]),
        inspect.Parameter("destroy_data", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[
            bool, typer.Option(
                "--destroy-data",
                help="Format DEVICE even if it looks in use (mounted, partitioned, holding a "
                     "filesystem), destroying its contents.")]),
    ]
    for knob, (type_, default, help_) in module.KNOBS.items():
        params.append(inspect.Parameter(knob, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[
            type_, typer.Option(_option_name(knob), help=help_)]))
    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = (f"{module.DESCRIPTION}\n\nSets everything up on DEVICE (or a scratch loop device), "
                       "captures the workload, and removes what it set up, even on failure or Ctrl-C. "
                       f"Needs root. Example: replay capture recipe {name} -o {name}.parquet")
    single = typer.Typer(add_completion=False)
    single.command(name)(command)
    return typer.main.get_command(single)


def _run_recipe(name: str, module, values: dict) -> None:
    device, output = values.pop("device"), values.pop("output")
    backend, destroy_data = values.pop("backend"), values.pop("destroy_data")
    notices = []

    def started(chosen):
        typer.echo(f"recipe {name}: tracing with {chosen} until the workload ends", err=True)

    def show_notices():
        for n in notices:
            typer.echo(f"note: {n}", err=True)

    try:
        result = module.run(device, output, notices=notices, destroy_data=destroy_data,
                            backend=backend.value, on_start=started, **values)
    except ReplayError as e:
        show_notices()
        fail(e)
    except KeyboardInterrupt:
        show_notices()
        typer.echo("interrupted: no trace was written; everything the recipe set up was removed", err=True)
        raise typer.Exit(130)
    show_notices()
    typer.echo(f"captured {result.rows} I/Os with recipe {name} ({result.lost_events} events lost): "
               f"{result.output}")


app = typer.Typer(
    cls=_DeviceOrRecipe,
    help="Trace a block device while a command runs (replay capture DEVICE -o OUT -- COMMAND), or "
         "capture a real application with a recipe (replay capture recipe NAME -o OUT).",
    no_args_is_help=False,
)
app.command("device", hidden=True)(capture)
recipes = typer.Typer(cls=_Recipes,
                      help="Capture a real application: set it up on DEVICE (or a scratch loop "
                           "device), trace its workload, tear everything down. One subcommand "
                           "per recipe.")
app.add_typer(recipes, name="recipe")


@recipes.callback(invoke_without_command=True)
def _recipes(
    ctx: typer.Context,
    list_: Annotated[bool, typer.Option(
        "--list",
        help="List the recipes with their knobs and defaults, then exit.")] = False,
):
    """Capture a real application: set it up on DEVICE (or a scratch loop device), trace its
    workload, and tear everything down, even on failure or Ctrl-C. Needs root.

    Example: replay capture recipe oltp -o oltp.parquet --duration 30 --clients 8
    """
    if ctx.invoked_subcommand is not None:
        return
    if not list_:
        typer.echo(ctx.get_help())
        return
    from traces.capture.recipes import load, names

    for name in names():
        module = load(name)
        typer.echo(f"{name}: {module.DESCRIPTION}")
        for knob, (type_, default, help_) in module.KNOBS.items():
            typer.echo(f"  {_option_name(knob)} {type_.__name__.upper()}  {help_} Default: {default}.")
