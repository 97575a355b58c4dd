"""`replay report RESULTS... -o report.html`: an HTML page of tables and plots, PNGs beside it."""
from pathlib import Path
from typing import Annotated, Optional

import typer

from replay.commands import fail
from traces.errors import ReplayError


def report(
    results: Annotated[list[Path], typer.Argument(
        help="Results files of `replay run` and results-set directories of `replay bench`.")],
    output: Annotated[Path, typer.Option(
        "--output", "-o",
        help="The HTML file to write; each plot is also written as "
             "OUTPUT_STEM_files/NAME.png.")] = Path("report.html"),
    label: Annotated[Optional[list[str]], typer.Option(
        "--label",
        help="Name of the target of each input, in order (one per input); inputs with the same "
             "label are one target. Default: the target's path.")] = None,
    window_ms: Annotated[Optional[float], typer.Option(
        "--window-ms",
        help="Width of the time-series windows (IOPS, latency and in-flight over time), in "
             "milliseconds. Default: one second, or shorter so a short run still has about 100 "
             "windows.")] = None,
):
    """Write a self-contained HTML report of replay results: summary tables, latency CDFs, IOPS,
    latency and in-flight over time, an offset heat map, the bench sets' charts as the reviews
    draw them (sweeps with their 70/30 and six-mix bars, a bar chart per single-point test,
    steady-state rounds and latency distribution) and, for two targets, the verdict. It needs
    no network to view; interrupted runs are marked partial; two inputs of one test under one
    label are both drawn, told apart by their file or directory name.

    Example: replay report slow/demo.parquet fast/demo.parquet -o report.html
    """
    from analysis.report import build_report

    if window_ms is not None and window_ms <= 0:
        fail("--window-ms must be a positive number of milliseconds")
    try:
        path = build_report(results, output, labels=label, bin_ns=int(window_ms * 1e6) if window_ms else None)
    except ReplayError as e:
        fail(e)
    typer.echo(f"report: {path} (plots in {path.with_name(path.stem + '_files')})")
