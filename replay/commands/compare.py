"""`replay compare RESULTS...`: the same trace or bench test on several targets, side by side."""
from typing import Annotated, Optional

import typer

from replay.commands import emit, fail
from traces.errors import ReplayError


def compare(
    results: Annotated[list[str], typer.Argument(
        help="Results files written by `replay run` (or directories written by `replay bench`), "
             "two or more; the first is the baseline of the ratios.")],
    label: Annotated[Optional[list[str]], typer.Option(
        "--label",
        help="Name of the target of each input, once per input and in order; inputs with the same "
             "label are repeat runs of one target, whose spread is its noise. Without it, inputs "
             "are grouped by target path.")] = None,
    force: Annotated[bool, typer.Option(
        "--force",
        help="Compare results of different traces (or bench tests) anyway; without it they are "
             "refused.")] = False,
    json_out: Annotated[bool, typer.Option(
        "--json",
        help="Print the comparison as JSON (values, 95 % intervals, ratios, significance per "
             "metric) instead of a table.")] = False,
):
    """Compare replays of the same trace on several targets: every metric side by side, its ratio
    to the first target, and a * where the difference is larger than run-to-run noise (repeat
    runs' range, or a bootstrap over time windows when a target has one run).

    Example: replay compare oltp-ssd.parquet oltp-hdd.parquet
    """
    from analysis.compare import compare as run_compare

    try:
        result = run_compare(results, labels=label or None, force=force)
    except ReplayError as e:
        fail(e)
    emit(result, json_out)
