"""`replay verdict`: does drive B's synthetic advantage over drive A show up in real use?"""
from pathlib import Path
from typing import Annotated, Optional

import typer

from replay.commands import emit, fail
from traces.errors import ReplayError


def verdict(
    synthetic_a: Annotated[list[Path], typer.Option(
        "--synthetic-a",
        help="A results set of `replay bench` (mix, steady, act) or a closed-loop results file, "
             "run on target A. Repeat for several tests.")],
    synthetic_b: Annotated[list[Path], typer.Option(
        "--synthetic-b",
        help="The same tests run on target B.")],
    traces_a: Annotated[list[Path], typer.Option(
        "--traces-a",
        help="Results files of `replay run` on target A, or a directory of them; matched with B's "
             "by the trace's name. Repeatable.")],
    traces_b: Annotated[list[Path], typer.Option(
        "--traces-b",
        help="Results files of `replay run` of the same traces on target B, or a directory of "
             "them.")],
    label_a: Annotated[Optional[str], typer.Option(
        "--label-a",
        help="Name shown for target A (default: its device or file path).")] = None,
    label_b: Annotated[Optional[str], typer.Option(
        "--label-b",
        help="Name shown for target B (default: its device or file path).")] = None,
    json_out: Annotated[bool, typer.Option(
        "--json",
        help="Print the verdict as JSON instead of a table.")] = False,
):
    """Set B's synthetic advantage over A next to what the same two targets did on real traces.

    For each trace replayed on both, the time the workload waited on storage, its p99 latency
    and, for closed-loop replays, the time to finish, as ratios A / B, and the share of the
    synthetic advantage they amount to (on a log scale: 100 % all of it, 0 % none).
    Example: replay verdict --synthetic-a slow/mix --synthetic-b fast/mix --traces-a slow/runs --traces-b fast/runs
    """
    from analysis.verdict import verdict as make_verdict

    try:
        result = make_verdict(synthetic_a, synthetic_b, traces_a, traces_b, label_a, label_b)
    except ReplayError as e:
        fail(e)
    emit(result, json_out)
