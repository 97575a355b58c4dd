"""The `replay` command: registers the command groups; their bodies live in replay.commands."""
import os

# Before numpy loads: OpenBLAS's idle worker threads spin on the cores the engine and the
# kernel's I/O workers need, and nothing here does linear algebra.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import typer  # noqa: E402

from replay.commands import (bench, capture, compare, convert, library, recover, report, run,  # noqa: E402
                             suite, verdict)

app = typer.Typer(
    help="tracereplay: replay real block I/O traces against drives and files.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("run")(run.run)
app.add_typer(capture.app, name="capture")
app.command("import")(convert.import_)
app.command("export")(convert.export)
app.add_typer(library.app, name="traces")
app.command("report")(report.report)
app.command("verdict")(verdict.verdict)
app.command("compare")(compare.compare)
app.command("bench")(bench.bench)
app.command("suite")(suite.suite)
app.command("recover")(recover.recover)


@app.callback()
def _main():
    """tracereplay: replay real block I/O traces against drives and files."""


def main():
    app()
