"""`replay verdict`: does drive B's synthetic advantage over drive A show up in real use?"""
from pathlib import Path
from typing import Annotated, Optional

import typer

from replay.commands import emit, fail
from traces.errors import ReplayError


def verdict(
    traces_a: Annotated[list[Path], typer.Option(
        "--traces-a",
        help="Results files of `replay run` on target A, a directory of them, or the directory "
             "of a `replay suite`; matched with B's by the trace's name. Repeatable.")],
    traces_b: Annotated[list[Path], typer.Option(
        "--traces-b",
        help="Results files of `replay run` of the same traces on target B, a directory of "
             "them, or the directory of a `replay suite`.")],
    synthetic_a: Annotated[Optional[list[Path]], typer.Option(
        "--synthetic-a",
        help="A results set of `replay bench` (mix, steady, act) or a closed-loop results file, "
             "run on target A. Repeat for several tests. Without synthetic tests, the verdict "
             "says what the faster target does to each workload.", show_default=False)] = None,
    synthetic_b: Annotated[Optional[list[Path]], typer.Option(
        "--synthetic-b",
        help="The same tests run on target B.", show_default=False)] = None,
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
    and, for closed-loop and causal replays, the time to finish, as ratios A / B, and the share
    of the synthetic advantage they amount to (on a log scale: 100 % all of it, 0 % none); then
    in how many workloads the faster target changes the run time by more than 10 %.
    Example: replay verdict --synthetic-a slow/mix --synthetic-b fast/mix --traces-a slow/runs --traces-b fast/runs
    """
    from analysis.verdict import verdict as make_verdict

    try:
        result = make_verdict(synthetic_a or [], synthetic_b or [], traces_a, traces_b, label_a, label_b)
    except ReplayError as e:
        fail(e)
    emit(result, json_out)
