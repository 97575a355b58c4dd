"""The library catalog: one row per trace of a directory (its characterisation, flattened into
plain columns) in a Parquet table that DuckDB or Polars reads unchanged, and SQL over it.

The per-file work (`describe_file`, `import_file`) is plain functions of a path, so the same
code runs in this process, in a pool of local processes, or as Ray tasks (replay.cluster).
"""
import os
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

from traces.errors import ReplayError

CATALOG_NAME = "catalog.parquet"
# The table's columns, in order: names carry their units, as the trace schema's do.
CATALOG_SCHEMA = pa.schema([
    ("path", pa.string()),
    ("name", pa.string()),
    ("source", pa.string()),  # how the trace was made: import:msr, capture, synth:demo, ...
    ("format", pa.string()),  # the imported file's format, or null
    ("inputs", pa.string()),  # the imported files' names, comma-separated
    ("ios", pa.int64()),
    ("reads", pa.int64()),
    ("writes", pa.int64()),
    ("discards", pa.int64()),
    ("flushes", pa.int64()),
    ("read_bytes", pa.int64()),
    ("write_bytes", pa.int64()),
    ("duration_s", pa.float64()),
    ("read_share", pa.float64()),  # reads / (reads + writes), by count
    ("read_share_bytes", pa.float64()),
    ("dominant_size", pa.int64()),  # the commonest read or write size, bytes
    ("sequential_share", pa.float64()),
    ("interarrival_p50_ns", pa.int64()),
    ("interarrival_cv", pa.float64()),  # burstiness: 1 Poisson, > 1 bursty
    ("peak_to_mean_ios", pa.float64()),  # busiest window over the mean window
    ("mean_queue_depth", pa.float64()),
    ("latency_p99_ns", pa.int64()),  # when the trace recorded latencies
    ("span_bytes", pa.int64()),
    ("footprint_bytes", pa.int64()),  # distinct 4 KiB blocks touched, in bytes
    ("footprint_exact", pa.bool_()),
    ("reuse_p50_bytes", pa.int64()),
    ("reuse_p90_bytes", pa.int64()),
    ("reuse_cold_share", pa.float64()),
    ("file_bytes", pa.int64()),
    ("characterised", pa.string()),  # UTC, ISO 8601
])


def _int(value):
    return None if value is None else int(value)


def catalog_row(path, trace=None, c=None) -> dict:
    """The catalog row of the trace at `path` (opened and characterised unless given)."""
    from analysis.characterise import characterise
    from traces.trace import open_trace

    trace = trace or open_trace(path)
    c = c or characterise(trace)
    source = trace.metadata.get("source")
    source = source if isinstance(source, dict) else {"kind": source}
    inputs = source.get("inputs")
    return {
        "path": str(Path(path).resolve()),
        "name": str(trace.metadata.get("name", Path(path).stem)),
        "source": None if source.get("kind") is None else str(source.get("kind")),
        "format": source.get("format"),
        "inputs": ",".join(map(str, inputs)) if isinstance(inputs, list) else None,
        "ios": c.ios, "reads": c.reads, "writes": c.writes, "discards": c.discards,
        "flushes": c.flushes, "read_bytes": c.read_bytes, "write_bytes": c.write_bytes,
        "duration_s": c.duration_ns / 1e9,
        "read_share": c.read_share_count, "read_share_bytes": c.read_share_bytes,
        "dominant_size": _int(c.dominant_sizes[0][0]) if c.dominant_sizes else None,
        "sequential_share": c.sequential_share,
        "interarrival_p50_ns": _int(c.interarrival_ns.get("p50")),
        "interarrival_cv": c.interarrival_cv, "peak_to_mean_ios": c.peak_to_mean_ios,
        "mean_queue_depth": c.mean_queue_depth,
        "latency_p99_ns": _int(c.latency_ns.get("p99")),
        "span_bytes": c.span_bytes, "footprint_bytes": c.working_set_bytes,
        "footprint_exact": c.working_set_exact,
        "reuse_p50_bytes": _int(c.reuse_distance_bytes.get("p50")),
        "reuse_p90_bytes": _int(c.reuse_distance_bytes.get("p90")),
        "reuse_cold_share": c.reuse_cold_share,
        "file_bytes": os.stat(path).st_size,
        "characterised": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def describe_file(path) -> dict:
    """A worker's job for `replay traces ls/show/catalog`: the catalog row of one trace file
    and its full characterisation (`characterisation`, `metadata`, `rows`: not catalog
    columns). Raises ReplayError for a file that is not a valid trace."""
    from analysis.characterise import characterise
    from traces.trace import open_trace

    trace = open_trace(path)
    c = characterise(trace)
    row = catalog_row(path, trace, c)
    return {**row, "characterisation": c.to_dict(), "metadata": trace.metadata,
            "rows": trace.num_rows, "column_names": list(trace.column_names)}


def import_file(job: dict) -> dict:
    """A worker's job for `replay import FILE... -o DIR`: one input file into its own trace.
    `job`: input, output, format (or None), options, command. Returns the catalog row of
    the trace written. Raises ReplayError (naming the file) for a bad input."""
    from traces.convert import import_trace

    out, rows = import_trace([job["input"]], job["output"], job.get("format"), job.get("options"),
                             command=job.get("command"))
    return catalog_row(out)


def trace_files(directory: Path) -> list[Path]:
    """The .parquet traces in `directory`, sorted; its catalog is not one of them."""
    return sorted(p for p in Path(directory).glob("*.parquet")
                  if p.is_file() and p.name != CATALOG_NAME)


def write_catalog(rows: list[dict], path) -> Path:
    """Write the catalog rows (in the given order) as a Parquet table, atomically."""
    import pyarrow.parquet as pq

    path = Path(path)
    table = pa.Table.from_pylist([{f.name: r.get(f.name) for f in CATALOG_SCHEMA} for r in rows],
                                 schema=CATALOG_SCHEMA)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ReplayError(f"cannot write the catalog {path}: {e.strerror or e}") from None
    return path


def catalog_path(where) -> Path:
    """The catalog a --catalog argument means: a file as is, a directory's catalog.parquet."""
    where = Path(where)
    path = where / CATALOG_NAME if where.is_dir() else where
    if not path.is_file():
        raise ReplayError(f"{path}: no catalog there; make one with `replay traces catalog DIR`")
    import pyarrow.parquet as pq

    try:
        names = set(pq.read_schema(path).names)
    except (OSError, pa.ArrowException):
        names = set()
    if "path" not in names or not names <= {f.name for f in CATALOG_SCHEMA}:
        raise ReplayError(f"{path}: not a catalog (a trace or results file?); "
                          "make one with `replay traces catalog DIR`")
    return path


def query(where, sql: str) -> tuple[list[str], list[tuple]]:
    """Run `sql` with DuckDB over the catalog, which it sees as the table `catalog`; returns
    (column names, rows)."""
    path = catalog_path(where)
    try:
        import duckdb
    except ImportError:
        raise ReplayError("replay traces query needs DuckDB: pip install 'tracereplay[cluster]'") from None
    con = duckdb.connect(":memory:")
    try:
        literal = str(path).replace("'", "''")
        con.execute(f"CREATE TABLE catalog AS SELECT * FROM read_parquet('{literal}')")
        # The query only reads the catalog: no COPY TO, ATTACH, INSTALL or read of other files.
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        try:
            cursor = con.execute(sql)
        except duckdb.Error as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ReplayError(f"the query failed: {first}") from None
        if cursor.description is None:
            return [], []
        return [d[0] for d in cursor.description], cursor.fetchall()
    finally:
        con.close()


def update_catalog(rows: list[dict], path) -> Path:
    """Add `rows` to the catalog at `path` (made if missing), replacing the rows of the same
    traces; the rows are kept sorted by path."""
    import pyarrow.parquet as pq

    path = Path(path)
    merged = {}
    if path.is_file():
        try:
            merged = {r["path"]: r for r in pq.read_table(path).to_pylist()}
        except (OSError, pa.ArrowException, KeyError):
            merged = {}  # an unreadable catalog is rebuilt from what is imported now
    merged.update({r["path"]: r for r in rows})
    return write_catalog([merged[p] for p in sorted(merged)], path)
