"""`replay traces ls|show|verify|catalog|query`: list, describe and check the traces of the library
and a directory, catalog a directory and query the catalog with SQL."""
import json
from pathlib import Path
from typing import Annotated, List, Optional

import numpy as np
import typer

from replay.commands import fail
from traces.errors import ReplayError, TraceFormatError

app = typer.Typer(
    help="List, describe and check traces: the bundled library and your own .parquet files.",
    no_args_is_help=True,
)


def _source(metadata: dict) -> str:
    source = metadata.get("source")
    if isinstance(source, dict):
        return str(source.get("kind", "-"))
    return str(source) if source else "-"


ClusterOption = Annotated[Optional[str], typer.Option(
    "--cluster", envvar="RAY_ADDRESS",
    help="Run the work as Ray tasks on the cluster at this address (HOST:PORT of the head, as "
         "`ray start --head` prints it; RAY_ADDRESS also sets it), `auto` for the one `ray start` "
         "began on this machine, or `local` for a Ray on 127.0.0.1 that lasts as long as the "
         "command. Every node must see the files at the same paths. Without it, the files are "
         "worked on by local processes.")]
JobsOption = Annotated[Optional[int], typer.Option(
    "--jobs", "-j", min=1,
    help="Without --cluster: how many files are worked on at once, each in its own process "
         "(default: one per core).")]


def _described(paths, cluster, jobs):
    """(path, catalog row or None, error or None) per path, in order, each as soon as it and
    all before it are done; the files are characterised in parallel (replay.cluster)."""
    from replay.cluster import in_order, run_each
    from analysis.catalog import describe_file

    try:
        for done in in_order(run_each(describe_file, [str(p) for p in paths], cluster, jobs), len(paths)):
            yield paths[done.index], done.value, done.error
    except ReplayError as e:
        fail(e)


def _expand(names) -> list[Path]:
    """Trace arguments as files: a directory stands for its .parquet traces."""
    from traces import library
    from analysis.catalog import trace_files

    paths = []
    for name in names:
        if Path(name).is_dir():
            paths += trace_files(Path(name))
            continue
        try:
            paths.append(library.resolve(name))
        except ReplayError as e:
            fail(e)
    return paths


@app.command("ls")
def ls(
    directory: Annotated[Optional[Path], typer.Argument(
        help="Also list the .parquet traces in this directory.")] = None,
    cluster: ClusterOption = None,
    jobs: JobsOption = None,
):
    """List the bundled traces (and those in DIRECTORY), one line each: name, I/Os, duration,
    read share by count and by bytes, dominant sizes, span and source.

    The traces are characterised in parallel, on local cores or with --cluster on a Ray
    cluster; lines appear in name order as they are ready. A file that is not a valid trace
    is listed as invalid, with the reason, and the exit code is then 1.
    Example: replay traces ls ~/traces
    """
    from traces.units import human_bytes
    from traces import library
    from analysis.catalog import trace_files

    paths = [library.library_dir() / f"{n}{library.SUFFIX}" for n in library.available()]
    if directory is not None:
        if not directory.is_dir():
            fail(ReplayError(f"{directory}: no such directory"))
        paths += trace_files(directory)
    typer.echo(f"{'name':<20} {'I/Os':>10} {'duration':>10} {'read% n/B':>10}  {'sizes':<22} {'span':>9}  source")
    failed = 0
    for path, row, error in _described(paths, cluster, jobs):
        label = path.stem if path.parent == library.library_dir() else str(path)
        if error is not None:
            typer.echo(f"{label:<20} invalid: {error}")
            failed += 1
            continue
        c = row["characterisation"]
        share = ("-" if c["read_share_count"] is None
                 else f"{100 * c['read_share_count']:.0f}/{100 * c['read_share_bytes']:.0f}")
        sizes = ",".join(human_bytes(s, short=True).replace(" ", "") for s, _, _ in c["dominant_sizes"]) or "-"
        typer.echo(f"{label:<20} {c['ios']:>10,} {c['duration_ns'] / 1e9:>9.1f}s {share:>10}  {sizes:<22} "
                   f"{human_bytes(c['span_bytes'], short=True).replace(' ', ''):>9}  {_source(row['metadata'])}")
    if failed:
        typer.echo(f"{failed} of {len(paths)} files are not valid traces", err=True)
        raise typer.Exit(1)


@app.command("show")
def show(
    names: Annotated[List[str], typer.Argument(
        help="Trace files, directories of them, or names of bundled traces (for example: demo).")],
    json_out: Annotated[bool, typer.Option(
        "--json",
        help="Print the metadata and the characterisation as one JSON object (a list of them for "
             "several traces).")] = False,
    cluster: ClusterOption = None,
    jobs: JobsOption = None,
):
    """Print a trace's full metadata and its characterisation: size histogram, sequentiality,
    inter-arrival and latency percentiles, burstiness, queue depth over time, span, footprint
    and working set over time, and reuse distance.

    Several traces (or a directory) are characterised in parallel, on local cores or with
    --cluster on a Ray cluster, and printed in order; one that fails is named with its error,
    the others are still shown, and the exit code is then 1. Example: replay traces show oltp
    """
    from analysis.characterise import Characterisation, format_text

    paths = _expand(names)
    if not paths:
        fail(ReplayError(f"no .parquet traces in {', '.join(names)}"))
    single = len(paths) == 1 and not Path(names[0]).is_dir()
    failed, reports = 0, []
    for path, row, error in _described(paths, cluster, jobs):
        if error is not None:
            if single:
                fail(error)
            typer.echo(f"error: {path}: {error}", err=True)
            failed += 1
            continue
        if json_out:
            report = {"path": str(path), "rows": row["rows"], "metadata": row["metadata"],
                      "characterisation": row["characterisation"]}
            if single:
                typer.echo(json.dumps(report, indent=2))
            reports.append(report)
            continue
        typer.echo(f"{path}  ({row['rows']:,} rows; columns: {', '.join(row['column_names'])})")
        typer.echo(json.dumps(row["metadata"], indent=2, sort_keys=True))
        typer.echo(format_text(Characterisation(**row["characterisation"])))
    if json_out and not single:
        typer.echo(json.dumps(reports, indent=2))
    if failed:
        typer.echo(f"{failed} of {len(paths)} traces failed", err=True)
        raise typer.Exit(1)


@app.command("catalog")
def catalog(
    directory: Annotated[Path, typer.Argument(help="The directory of .parquet traces to catalog.")],
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o",
        help="The catalog to write (Parquet). Default: DIRECTORY/catalog.parquet.")] = None,
    cluster: ClusterOption = None,
    jobs: JobsOption = None,
):
    """Characterise every trace in DIRECTORY and write the library catalog: one row per trace
    (name, source, I/Os, duration, read share, sizes, burstiness, queue depth, span,
    footprint, reuse distance, ...), a Parquet table that `replay traces query`, DuckDB or
    Polars read as it is.

    The traces are characterised in parallel, on local cores or with --cluster on a Ray
    cluster, with one progress line per file on stderr; a file that fails is named with its
    error and left out, the others are cataloged, and the exit code is then 1.
    Example: replay traces catalog ~/traces --cluster 10.0.0.1:6379
    """
    from analysis.catalog import CATALOG_NAME, trace_files, write_catalog

    if not directory.is_dir():
        fail(ReplayError(f"{directory}: no such directory"))
    paths = trace_files(directory)
    if not paths:
        fail(ReplayError(f"{directory}: no .parquet traces to catalog"))
    rows, failed = [], 0
    for k, (path, row, error) in enumerate(_described(paths, cluster, jobs), 1):
        if error is not None:
            failed += 1
            typer.echo(f"[{k}/{len(paths)}] {path.name}: failed: {error}", err=True)
            continue
        rows.append(row)
        typer.echo(f"[{k}/{len(paths)}] {path.name}: {row['ios']:,} I/Os", err=True)
    try:
        out = write_catalog(rows, output or directory / CATALOG_NAME)
    except ReplayError as e:
        fail(e)
    typer.echo(f"cataloged {len(rows)} traces in {out}")
    if failed:
        typer.echo(f"{failed} of {len(paths)} files failed and are not in the catalog", err=True)
        raise typer.Exit(1)


@app.command("query")
def query(
    sql: Annotated[str, typer.Argument(
        help="A SQL query (DuckDB's dialect) over the table `catalog`.")],
    catalog_at: Annotated[Path, typer.Option(
        "--catalog", "-c",
        help="The catalog file, or a directory holding catalog.parquet.")] = Path("."),
    json_out: Annotated[bool, typer.Option(
        "--json",
        help="Print the rows as a JSON list of objects.")] = False,
):
    """Run SQL over a library catalog (made by `replay traces catalog`) with DuckDB, which
    sees it as the table `catalog`; columns are named with their units (footprint_bytes,
    duration_s, read_share from 0 to 1).

    Example: replay traces query "SELECT name, read_share, footprint_bytes FROM catalog
    WHERE read_share > 0.7 AND footprint_bytes < 10 * 2^30 ORDER BY name" --catalog ~/traces
    """
    from analysis.catalog import query as run_query

    try:
        columns, rows = run_query(catalog_at, sql)
    except ReplayError as e:
        fail(e)
    if json_out:
        typer.echo(json.dumps([dict(zip(columns, r)) for r in rows], indent=2, default=str))
        return
    if not columns:
        return
    cells = [[("-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    typer.echo("  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip())
    for r in cells:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    typer.echo(f"({len(rows)} rows)", err=True)


def verify_trace(trace) -> int:
    """Read every row, checking the schema rules and the metadata's promises; the row count."""
    from traces.schema import Flag

    device_size = trace.metadata.get("device_size")
    known_flags = int(Flag.SYNC | Flag.FUA | Flag.META | Flag.READAHEAD)
    from traces.formats.ordering import MAX_GAP_NS, span_text

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
    name: Annotated[str, typer.Argument(
        help="Trace file, or the name of a bundled trace (for example: demo).")],
):
    """Check a trace's schema, every row's invariants (non-decreasing ts_ns, known op codes,
    non-negative offsets, only flushes empty, I/Os within device_size, no gap of more than 90
    days before an I/O: a damaged timestamp) and its metadata.

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
