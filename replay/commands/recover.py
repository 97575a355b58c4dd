"""`replay recover OUT.<hex>.partial`: the results file of a run that was killed (SIGKILL, a
power cut) or stopped by a full disk, from the journal it left."""
from pathlib import Path
from typing import Annotated, Optional

import typer

from replay.commands import fail
from traces.errors import ReplayError


def recover(
    journal: Annotated[Path, typer.Argument(
        help="The OUT.<hex>.partial journal a run left next to its results file OUT.")],
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o",
        help="Results file to write (Parquet). Default: OUT, the run's own results path.")] = None,
    force: Annotated[bool, typer.Option(
        "--force",
        help="Replace the -o file if it exists. Without it an existing file is refused, and never "
             "is one that another process is writing.")] = False,
):
    """Make the results file of a run that did not finish, from the journal it left.

    A run writes its results to a journal that survives SIGKILL and, but for the last
    seconds, a power cut; the journal becomes the Parquet results file when the run ends.
    This does that for a run that never ended: every row up to the last complete batch is
    kept, the summary is computed from them, and the file is marked interrupted; then the
    journal is removed. Example: replay recover oltp-sdc.parquet.1a2b3c4d.partial
    """
    from replay.output import recover as run_recover

    try:
        path, rows = run_recover(journal, output, force=force)
    except (ReplayError, ValueError) as e:
        fail(e)
    typer.echo(f"recovered {rows} I/Os from {journal}: {path}, marked interrupted")
