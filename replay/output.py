"""The results file: its default name, the room it needs, its journal while the run goes,
closing it, and recovering the journal a killed run left.
"""
import errno
import glob
import os
from datetime import datetime
from pathlib import Path

import pyarrow as pa

from analysis.summary import RunSummary
from traces import schema
from traces.errors import ReplayError
from traces.outputs import check_output
from traces.targets import Target
from traces.trace import JournalKept, TraceWriter, convert_journal, journal_in_use, read_journal
from traces.units import human_bytes

# Results rows per row group: held in memory while the run goes until the group is written,
# and one more while the last is encoded (57 bytes a row: 7.5 MB each), and a results file's
# footer, which the writer keeps in memory, grows by 6.95 KB per row group, 0.84 KB once
# written (bench/bench_suite.py). bench/memory.py's peak (goal 300 MB): 276.5 MB; 296.5 MB at
# 1 << 18 with the encoding on its thread, 286.4 MB at 1 << 19 without; for footers 2.6 and 4
# MB smaller per 100M rows.
RESULT_GROUP_ROWS = 1 << 17
# Results stream into a journal (TraceWriter's journal_s) that is fsynced this often, and
# each piece pushed to the engine is cut to complete within about this long, so a SIGKILL
# or a power cut loses seconds of rows, not the run (see pieces).
RESULT_FLUSH_S = 2.0
# Room a results row takes at most, journal and Parquet file together (both are written
# while the run goes), checked against the free space before any I/O:
# measured 11.4 + 6.3 bytes over 20M random 4 KiB I/Os on the null engine (both lz4); at QD1
# the journal took 21.5 until it stored the clock columns as differences, 6.3 since (5.1 the file).
RESULT_ROW_BYTES = 24


def default_output(trace_name: str, target: Target) -> Path:
    """TRACE-TARGET-TIMESTAMP.parquet in the current directory."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(f"{trace_name}-{Path(target.path).name.strip('()').replace(' ', '-')}-{stamp}.parquet")


def open_results(output: Path, column_names, metadata: dict, notices, force=False,
                 beside=True) -> tuple[TraceWriter, list[str]]:
    """The results writer, journalling as it goes, and the trace columns it keeps: those of
    `column_names` the schema knows, followed by the result columns. With `force` it
    replaces an existing file; `beside`: the Parquet file is encoded as the rows come (else
    made from the journal at close, `TraceWriter`)."""
    columns = [(name, schema.OPTIONAL_COLUMNS.get(name) or pa.from_numpy_dtype(schema.TRACE_COLUMNS[name]))
               for name in column_names
               if name in schema.OPTIONAL_COLUMNS or name in schema.TRACE_COLUMNS]
    keep = [name for name, _ in columns]
    columns += schema.RESULT_ARROW_FIELDS
    # lz4: half zstd's CPU time per row (0.12 vs 0.24 us), which the engine's host shares.
    try:
        writer = TraceWriter(output, columns, metadata, compression="lz4",
                             group_rows=RESULT_GROUP_ROWS, journal_s=RESULT_FLUSH_S, force=force,
                             beside=beside)
    except ReplayError:  # another run claimed `output` meanwhile
        raise
    except OSError as e:
        raise ReplayError(f"cannot write the results in {output.parent or '.'} ({e.strerror or e}); "
                          "nothing was replayed") from None
    notice_journals(output, writer.tmp_path, notices)
    return writer, keep


def check_room(output: Path, rows) -> None:
    """Refuse, before any I/O, a results file that will not fit where it goes."""
    if not rows:
        return  # a generator of unknown length: the journal keeps what fits (close_results)
    directory = output.parent if str(output.parent) else Path(".")
    try:
        fs = os.statvfs(directory)
    except OSError:
        return  # the writer's own open reports a directory it cannot use
    free, needed = fs.f_bavail * fs.f_frsize, rows * RESULT_ROW_BYTES
    if free < needed:
        raise ReplayError(
            f"the results of {rows:,} I/Os need up to {human_bytes(needed)} ({needed} bytes) "
            f"but {directory} has {human_bytes(free)} ({free} bytes) free; free some space "
            "or give -o on a larger filesystem")


def notice_journals(output: Path, ours: Path, notices) -> None:
    """Say so when an earlier run into the same file left a journal that no run writes."""
    for journal in sorted(output.parent.glob(f"{glob.escape(output.name)}.*.partial")):
        if journal != ours and journal.stat().st_size and not journal_in_use(journal):
            notices.append(f"{journal} is the journal of an earlier run that did not finish: "
                           f"`replay recover {journal} -o FILE` makes its results file")


def close_results(writer, merger, metadata, cause=None) -> Path:
    """Finish the results file with `metadata` (a function of the summary, which a merger that
    does not summarise as rows come makes from the journal here), or, where that fails (a full
    disk), raise one ReplayError that names the journal kept with every row written and how to
    recover it."""
    try:
        return writer.close(lambda: metadata(merger.summary),
                            None if merger.summarising else merger.summary.add_batch)
    except JournalKept as e:
        problem = cause if isinstance(cause, OSError) else e.cause
        what = ("the results filesystem is full" if problem.errno == errno.ENOSPC
                else "the results cannot be written")
        raise ReplayError(
            f"{what} ({problem.strerror or problem}): the run stopped after {merger.done:,} I/Os; "
            f"the {e.rows:,} written are kept in {e.journal}: free some space, then "
            f"`replay recover {e.journal}` makes the results file") from None


def recover(journal, output=None, force=False) -> tuple[Path, int]:
    """Turn the journal (`OUT.<hex>.partial`) that a killed or failed run left into its
    results file, OUT or `output`, marked interrupted, then removes it; returns (path, rows).
    The rows are the journal's up to its last complete batch; the summary is computed from
    them. An existing results file is replaced only with `force`."""
    journal = Path(journal)
    if journal.is_file() and journal_in_use(journal):
        raise ReplayError(f"{journal} is still being written by a running replay, which makes "
                          "its results file when it ends; stop it first to recover its rows now")
    _, metadata, _ = read_journal(journal)
    if metadata.get("kind") != "results":
        raise ReplayError(f"{journal} is not the journal of a replay run's results")
    name = journal.name.removesuffix(".partial")
    output = Path(output) if output else journal.with_name(name.rsplit(".", 1)[0] if "." in name else name)
    check_output(output, inputs=[(journal, "the journal being recovered")], force=force)
    summary, rows = RunSummary(), 0

    def counted(batch):
        nonlocal rows
        summary.add_batch(batch)
        rows += batch.num_rows

    def closing():
        return {"interrupted": True, "recovered_from": journal.name, "rows_done": rows,
                "summary": summary.to_dict()}

    try:
        path = convert_journal(journal, output, closing, "lz4", RESULT_GROUP_ROWS, counted, force=force)
    except OSError as e:
        raise ReplayError(f"cannot write {output} ({e.strerror or e}); the journal is left as it "
                          "was") from None
    journal.unlink()
    return path, rows
