"""`replay traces ls|show|verify`: list, describe and check the traces of the library and a directory."""
import json
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer

from replay.commands import fail
from replay.errors import ReplayError, TraceFormatError

app = typer.Typer(
    help="List, describe and check traces: the bundled library and your own .parquet files.",
    no_args_is_help=True,
)


def _open(name: str):
    from traces import library
    from traces.trace import open_trace

    return open_trace(library.resolve(name))


def _source(metadata: dict) -> str:
    source = metadata.get("source")
    if isinstance(source, dict):
        return str(source.get("kind", "-"))
    return str(source) if source else "-"


@app.command("ls")
def ls(
    directory: Annotated[Optional[Path], typer.Argument(help="Also list the .parquet traces in this directory.")] = None,
):
    """List the bundled traces (and those in DIRECTORY), one line each: name, I/Os, duration,
    read share by count and by bytes, dominant sizes, span and source.

    A file that is not a valid trace is listed as invalid, with the reason. Example: replay traces ls ~/traces
    """
    from analysis.characterise import characterise, human_bytes
    from traces import library
    from traces.trace import open_trace

    paths = [library.library_dir() / f"{n}{library.SUFFIX}" for n in library.available()]
    if directory is not None:
        if not directory.is_dir():
            fail(ReplayError(f"{directory}: no such directory"))
        paths += sorted(p for p in directory.glob(f"*{library.SUFFIX}") if p.is_file())
    typer.echo(f"{'name':<20} {'I/Os':>10} {'duration':>10} {'read% n/B':>10}  {'sizes':<22} {'span':>9}  source")
    for path in paths:
        label = path.stem if path.parent == library.library_dir() else str(path)
        try:
            trace = open_trace(path)
            c = characterise(trace)
        except ReplayError as e:
            typer.echo(f"{label:<20} invalid: {e}")
            continue
        share = "-" if c.read_share_count is None else f"{100 * c.read_share_count:.0f}/{100 * c.read_share_bytes:.0f}"
        sizes = ",".join(human_bytes(s).replace(" ", "") for s, _, _ in c.dominant_sizes) or "-"
        typer.echo(f"{label:<20} {c.ios:>10,} {c.duration_ns / 1e9:>9.1f}s {share:>10}  {sizes:<22} "
                   f"{human_bytes(c.span_bytes).replace(' ', ''):>9}  {_source(trace.metadata)}")


@app.command("show")
def show(
    name: Annotated[str, typer.Argument(help="Trace file, or the name of a bundled trace (for example: demo).")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the metadata and the characterisation as one JSON object.")] = False,
):
    """Print a trace's full metadata and its characterisation: size histogram, sequentiality,
    inter-arrival and latency percentiles, burstiness, queue depth over time, span, footprint
    and working set over time, and reuse distance.

    Example: replay traces show oltp
    """
    from analysis.characterise import characterise, format_text

    try:
        trace = _open(name)
        c = characterise(trace)
    except ReplayError as e:
        fail(e)
    if json_out:
        typer.echo(json.dumps({"path": str(trace.path), "rows": trace.num_rows,
                               "metadata": trace.metadata, "characterisation": c.to_dict()}, indent=2))
        return
    typer.echo(f"{trace.path}  ({trace.num_rows:,} rows; columns: {', '.join(trace.column_names)})")
    typer.echo(json.dumps(trace.metadata, indent=2, sort_keys=True))
    typer.echo(format_text(c))


def verify_trace(trace) -> int:
    """Read every row, checking the schema rules and the metadata's promises; the row count."""
    from traces.schema import Flag

    device_size = trace.metadata.get("device_size")
    known_flags = int(Flag.SYNC | Flag.FUA | Flag.META | Flag.READAHEAD)
    from traces.convert import MAX_GAP_NS, span_text

    columns = [n for n in trace.column_names if n != "comm"]
    row, last_ts = 0, 0
    for chunk in trace.chunks(columns):
        n = len(chunk["ts_ns"])
        # A gap no block trace has (see MAX_GAP_NS): a damaged timestamp, as in a 40-year trace.
        gaps = np.diff(chunk["ts_ns"], prepend=last_ts)
        if (far := gaps > MAX_GAP_NS).any():
            i = int(far.argmax())
            raise TraceFormatError(trace.path, f"ts_ns jumps by {span_text(gaps[i])} (more than "
                                   f"{span_text(MAX_GAP_NS)}): a damaged timestamp", "ts_ns", row + i)
        last_ts = int(chunk["ts_ns"][-1]) if n else last_ts
        if isinstance(device_size, int) and n:
            over = chunk["offset"] + chunk["length"] > device_size
            if over.any():
                i = int(over.argmax())
                raise TraceFormatError(trace.path, f"I/O ends at {int(chunk['offset'][i] + chunk['length'][i])}, "
                                       f"past device_size {device_size} in the metadata", "offset", row + i)
        if "flags" in chunk and (bad := (chunk["flags"] & ~np.uint8(known_flags)) != 0).any():
            i = int(bad.argmax())
            raise TraceFormatError(trace.path, f"unknown flag bits {int(chunk['flags'][i])}", "flags", row + i)
        if "latency_ns" in chunk and (bad := chunk["latency_ns"] < -1).any():
            i = int(bad.argmax())
            raise TraceFormatError(trace.path, f"latency_ns {int(chunk['latency_ns'][i])} below -1 (unknown)",
                                   "latency_ns", row + i)
        row += n
    if row != trace.num_rows:
        raise TraceFormatError(trace.path, f"read {row} rows but the footer says {trace.num_rows}")
    if row == 0:
        raise TraceFormatError(trace.path, "holds no I/Os (0 rows): there is nothing to replay; "
                               "check how the trace was made")
    return row


@app.command("verify")
def verify(
    name: Annotated[str, typer.Argument(help="Trace file, or the name of a bundled trace (for example: demo).")],
):
    """Check a trace's schema, every row's invariants (non-decreasing ts_ns, known op codes,
    non-negative offsets, only flushes empty, I/Os within device_size) and its metadata.

    Exit code 0 when the trace is valid, 1 when it is not (the first problem is printed).
    Example: replay traces verify capture.parquet
    """
    from traces import library

    try:
        path = library.resolve(name)
    except ReplayError as e:
        fail(e)
    from traces.trace import open_trace

    try:
        trace = open_trace(path)
        rows = verify_trace(trace)
    except ReplayError as e:
        typer.echo(f"invalid: {e}")
        raise typer.Exit(1)
    typer.echo(f"valid: {path}: {rows:,} rows, schema version {trace.metadata.get('schema_version', '-')}")
