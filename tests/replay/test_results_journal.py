"""The results journal of a run, and `recover`: a run killed at a known point leaves every
results chunk it wrote and nothing more, recovery makes them the results file, and what
recovery refuses (an existing file, a journal that is not a run's results) it leaves as it was.
"""
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.summary import RunSummary
from replay.output import RESULT_FLUSH_S, recover
from replay.runner import RunOptions, replay
from tests.cli_process import ENV, one_line, replay_cli, replay_process, wait_for
from tests.replay.test_durability import journal, make_trace
from traces import schema
from traces.errors import ReplayError
from traces.schema import Op
from traces.trace import TraceWriter, convert_journal, open_trace, read_journal, read_trace, write_trace

ROWS, CHUNK, KILLED_AFTER = 5000, 500, 3

# A run on the null engine that dies as a SIGKILL ends it (os._exit: no handler, no close)
# right after its results file took its KILLED_AFTER-th chunk, handed to the consumers after
# the write: the journal must hold exactly those chunks.
KILLED_RUN = textwrap.dedent("""
    import os
    import sys

    from replay.runner import RunOptions, replay

    class DieAfter:
        def __init__(self, chunks):
            self.left = chunks

        def add(self, chunk):
            self.left -= 1
            if self.left == 0:
                os._exit(9)

    trace, out, chunk_rows, chunks = sys.argv[1:]
    replay(trace, None, RunOptions(engine="null", chunk_rows=int(chunk_rows)),
           output=out, consumers=[DieAfter(int(chunks))])
""")


def _killed_run(tmp_path: Path, out: Path) -> Path:
    """Run KILLED_RUN on a trace of ROWS reads; returns the journal it left."""
    i = np.arange(ROWS, dtype=np.int64)
    trace = write_trace(tmp_path / "t.parquet", {
        "ts_ns": i * 1000, "op": np.full(ROWS, Op.READ, np.uint8), "offset": i * 4096,
        "length": np.full(ROWS, 4096, np.int64)}, {"name": "t"})
    done = subprocess.run([sys.executable, "-c", KILLED_RUN, str(trace), str(out), str(CHUNK),
                           str(KILLED_AFTER)], env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 9, done.stderr
    journals = list(out.parent.glob(f"{out.name}.*.partial"))
    assert len(journals) == 1 and not out.exists(), journals
    return journals[0]


def test_a_killed_run_leaves_exactly_the_chunks_it_wrote_and_recovery_makes_them_its_results(tmp_path):
    out = tmp_path / "out.parquet"
    journal = _killed_run(tmp_path, out)
    _, metadata, batches = read_journal(journal)
    assert metadata["kind"] == "results" and metadata["name"] == "t"
    assert sum(b.num_rows for b in batches) == KILLED_AFTER * CHUNK

    path, rows = recover(journal)
    assert path == out and rows == KILLED_AFTER * CHUNK and not journal.exists()
    cols, meta = read_trace(out)
    expected = np.arange(rows, dtype=np.int64)
    np.testing.assert_array_equal(cols["ts_ns"], expected * 1000)  # the trace's first rows, in order
    np.testing.assert_array_equal(cols["offset"], expected * 4096)
    assert (cols["result"] == 4096).all() and (cols["complete_ns"] >= cols["issue_ns"]).all()
    assert meta["interrupted"] is True and meta["recovered_from"] == journal.name
    assert meta["rows_done"] == rows and meta["summary"]["jobs"][0]["read"]["total_ios"] == rows


def test_recovery_never_replaces_a_file_and_keeps_the_journal(tmp_path):
    out = tmp_path / "out.parquet"
    journal = _killed_run(tmp_path, out)
    out.write_bytes(b"someone else's file")
    with pytest.raises(ReplayError, match=r"out\.parquet already exists; pass --force to replace it, or choose another -o"):
        recover(journal)
    assert out.read_bytes() == b"someone else's file" and journal.exists()
    path, rows = recover(journal, tmp_path / "elsewhere.parquet")
    assert path == tmp_path / "elsewhere.parquet" and rows == KILLED_AFTER * CHUNK


def test_a_journal_that_is_not_a_runs_results_is_refused_and_kept(tmp_path):
    columns = [("ts_ns", schema.pa.int64()), ("op", schema.pa.uint8()),
               ("offset", schema.pa.int64()), ("length", schema.pa.int64())]
    writer = TraceWriter(tmp_path / "t.parquet", columns, {"name": "t"}, journal_s=2.0)
    writer.write({"ts_ns": np.arange(3), "op": np.zeros(3, np.uint8), "offset": np.zeros(3),
                  "length": np.full(3, 4096)})
    journal = writer.keep()
    with pytest.raises(ReplayError, match="is not the journal of a replay run's results"):
        recover(journal)
    assert journal.exists() and not (tmp_path / "t.parquet").exists()


# ---- SIGKILL: the journal keeps all but the last seconds ---------------------------------


def test_a_killed_run_leaves_a_journal_that_recovers_the_rows_done(tmp_path):
    n, gap = 40_000, 1_000_000  # 1,000 IOPS for 40 s
    trace = make_trace(tmp_path / "t.parquet", n, gap)
    out = tmp_path / "out.parquet"
    with replay_process("run", trace, "--engine", "null", "-o", out, cwd=tmp_path) as proc:
        wait_for(proc, lambda: journal(out), "the run's start")
        started = time.monotonic()
        # While the run writes it, the journal is not recovered from under it.
        live = replay_cli("recover", journal(out)[0], cwd=tmp_path)
        assert live.returncode == 2 and "still being written" in one_line(live.stderr, "error:")
        assert journal(out) and not out.exists()
        time.sleep(max(0.0, 6 - (time.monotonic() - started)))
        proc.kill()
        proc.wait()
        ran = time.monotonic() - started
    [partial] = journal(out)
    assert not out.exists()
    # The next run into the same file points at it.
    small = make_trace(tmp_path / "small.parquet", 10, 1000)
    again = replay_cli("run", small, "--engine", "null", "-o", out, cwd=tmp_path)
    assert again.returncode == 0 and f"replay recover {partial}" in one_line(again.stderr, "note:")
    out.unlink()
    done = replay_cli("recover", partial, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert str(out) in done.stdout and not os.path.exists(partial)
    meta = open_trace(out).metadata
    cols, _ = read_trace(out)
    rows = len(cols["op"])
    assert meta["interrupted"] is True and meta["rows_done"] == rows
    assert meta["summary"]["jobs"][0]["read"]["total_ios"] == rows
    np.testing.assert_array_equal(cols["ts_ns"], np.arange(rows) * gap)
    assert np.all(cols["complete_ns"] >= cols["issue_ns"]) and np.all(cols["issue_ns"] >= 0)
    # Lost: at most the piece in flight and the one being written, each ~RESULT_FLUSH_S, and
    # the start-up the clock above includes.
    lost_s = ran - rows * gap / 1e9
    assert lost_s < 2 * RESULT_FLUSH_S + 1.5, (ran, rows)
    # A second recovery has nothing to work from, and says so in one line.
    again = replay_cli("recover", partial, cwd=tmp_path)
    assert again.returncode == 2 and "error:" in again.stderr and "Traceback" not in again.stderr


def test_a_journal_cut_mid_batch_recovers_up_to_its_last_whole_batch(tmp_path):
    from replay.runner import recover
    from traces import schema
    from traces.trace import TraceWriter

    columns = [("ts_ns", schema.pa.int64()), ("op", schema.pa.uint8()), ("offset", schema.pa.int64()),
               ("length", schema.pa.int64()), *schema.RESULT_ARROW_FIELDS]
    writer = TraceWriter(tmp_path / "r.parquet", columns, {"kind": "results", "name": "r"},
                         group_rows=1 << 19, journal_s=2.0)
    for k in range(3):
        ts = np.arange(1000, dtype=np.int64) + 1000 * k
        writer.write({"ts_ns": ts, "op": np.zeros(1000, np.uint8), "offset": ts * 4096,
                      "length": np.full(1000, 4096), "intended_ns": ts, "issue_ns": ts + 1,
                      "complete_ns": ts + 2, "result": np.full(1000, 4096)})
    partial = writer.keep()
    size = partial.stat().st_size
    os.truncate(partial, size - 100)  # the third batch, cut as a SIGKILL cuts it
    path, rows = recover(partial, tmp_path / "rec.parquet")
    cols, meta = read_trace(path)
    assert rows == 2000 and meta["rows_done"] == 2000 and meta["interrupted"] is True
    np.testing.assert_array_equal(cols["ts_ns"], np.arange(2000))


# ---- the Parquet file written beside the journal -------------------------------------------


def _results_writer(path, group_rows=1000, beside=True):
    columns = [("ts_ns", schema.pa.int64()), ("op", schema.pa.uint8()), ("offset", schema.pa.int64()),
               ("length", schema.pa.int64()), *schema.RESULT_ARROW_FIELDS]
    return TraceWriter(path, columns, {"kind": "results", "name": "r"}, compression="lz4",
                       group_rows=group_rows, journal_s=2.0, beside=beside)


def _unnamed_files(directory) -> int:
    """How many files this process has open in `directory` that have no name (O_TMPFILE)."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            found += os.readlink(f"/proc/self/fd/{fd}").startswith(f"{directory}/#")
        except OSError:
            pass  # the listing's own descriptor, closed since
    return found


def _chunks(sizes):
    start = 0
    for n in sizes:
        ts = np.arange(start, start + n, dtype=np.int64) * 1000
        start += n
        yield {"ts_ns": ts, "op": (ts // 1000 % 4).astype(np.uint8), "offset": ts * 4, "length": np.full(n, 4096),
               "intended_ns": ts, "issue_ns": ts + 7, "complete_ns": ts + 7 + ts % 13, "result": np.full(n, 4096)}


def test_the_results_file_written_beside_the_journal_is_the_journals_conversion(tmp_path):
    import pyarrow.parquet as pq

    sizes = [700, 1, 900, 0, 1500, 333]
    direct = _results_writer(tmp_path / "direct.parquet")
    kept = _results_writer(tmp_path / "kept.parquet")
    (tmp_path / "late").mkdir()
    late = _results_writer(tmp_path / "late" / "late.parquet", beside=False)
    for chunk in _chunks(sizes):
        direct.write(chunk)
        kept.write(chunk)
        late.write(chunk)
        # Only the journal has a name while the rows come: a killed run leaves nothing else.
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("direct")) == \
            [direct.tmp_path.name]
        # Not beside: no Parquet file, named or not, until close.
        assert list(late.tmp_path.parent.iterdir()) == [late.tmp_path] and _unnamed_files(late.tmp_path.parent) == 0
    extra = {"interrupted": False, "rows_done": sum(sizes)}
    direct.close(extra)
    late.close(extra)
    journal = kept.keep()
    # What closing did before: convert the journal into the results file.
    recovered = convert_journal(journal, tmp_path / "converted.parquet", extra, "lz4", 1000)
    journal.unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["converted.parquet", "direct.parquet", "late"]
    assert [p.name for p in (tmp_path / "late").iterdir()] == ["late.parquet"]
    a, b = pq.ParquetFile(tmp_path / "direct.parquet"), pq.ParquetFile(recovered)
    assert a.read().equals(b.read()) and a.num_row_groups == b.num_row_groups
    assert pq.ParquetFile(tmp_path / "late" / "late.parquet").read().equals(a.read())
    assert [a.metadata.row_group(i).num_rows for i in range(a.num_row_groups)] == \
        [b.metadata.row_group(i).num_rows for i in range(b.num_row_groups)] == [1601, 1500, 333]
    for i in range(a.num_row_groups):
        for j in range(a.metadata.num_columns):
            ca, cb = a.metadata.row_group(i).column(j), b.metadata.row_group(i).column(j)
            assert (ca.encodings, ca.compression, ca.statistics) == (cb.encodings, cb.compression, cb.statistics)
    meta = open_trace(tmp_path / "direct.parquet").metadata
    assert meta == open_trace(recovered).metadata == open_trace(tmp_path / "late" / "late.parquet").metadata
    assert meta["rows_done"] == sum(sizes)
    # An existing file is replaced (the run's --force), by the finished file whole.
    again = TraceWriter(tmp_path / "direct.parquet", [("ts_ns", schema.pa.int64())], {"kind": "results"},
                        journal_s=2.0, force=True)
    again.write({"ts_ns": np.arange(5)})
    again.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["converted.parquet", "direct.parquet", "late"]
    assert read_trace_columns(tmp_path / "direct.parquet") == list(range(5))


class UnnamedFiles(list):
    """A consumer that notes, at each results chunk, how many unnamed files are open in `directory`."""

    def __init__(self, directory):
        super().__init__()
        self.directory = directory

    def add(self, chunk):
        self.append(_unnamed_files(self.directory))


BESIDE = pytest.mark.parametrize("timing,engine,beside", [
    ("afap", "io_uring", False), ("afap", "psync", False), ("original", "io_uring", True), ("afap", "null", True)])


def _small_run(tmp_path, timing, engine, consumer, n=2000):
    """A replay of n 4 KiB reads in chunks of 500 rows on a file (or the null engine), with
    `consumer`; the rows' offsets and the outcome."""
    i = np.arange(n, dtype=np.int64)
    offsets = (i * 7919 % 4096) * 4096
    trace = write_trace(tmp_path / "t.parquet", {
        "ts_ns": i * 1000, "op": np.full(n, Op.READ, np.uint8), "offset": offsets,
        "length": np.full(n, 4096, np.int64)}, {"name": "t"})
    target = tmp_path / "target.img"
    with open(target, "wb") as f:
        f.truncate(16 << 20)
    (tmp_path / "out").mkdir(exist_ok=True)
    return offsets, replay(trace, None if engine == "null" else target,
                           RunOptions(timing=timing, engine=engine, qd=4, chunk_rows=500),
                           output=tmp_path / "out" / "r.parquet", consumers=[consumer])


@BESIDE
def test_as_fast_as_possible_on_a_device_the_results_file_is_made_from_the_journal_at_close(
        tmp_path, timing, engine, beside):
    # The CPU the encoding would take comes out of the I/Os then (replay.runner._made_beside).
    seen = UnnamedFiles(tmp_path / "out")
    offsets, outcome = _small_run(tmp_path, timing, engine, seen)
    assert [count > 0 for count in seen] == [beside] * 4
    got, meta = read_trace(outcome.output)
    np.testing.assert_array_equal(got["offset"], offsets)
    assert (got["result"] == 4096).all() and meta["rows_done"] == 2000 and meta["run"]["engine"] == engine


class SummaryAdds(list):
    """A consumer that notes, at each results chunk, how many chunks summaries have counted."""

    calls = 0

    def add(self, chunk):
        self.append(SummaryAdds.calls)


@BESIDE
def test_as_fast_as_possible_on_a_device_the_summary_is_made_from_the_journal_at_close(
        tmp_path, monkeypatch, timing, engine, beside):
    add = RunSummary.add

    def counted(self, chunk):
        SummaryAdds.calls += 1
        return add(self, chunk)

    monkeypatch.setattr(RunSummary, "add", counted)
    seen = SummaryAdds()
    _, outcome = _small_run(tmp_path, timing, engine, seen)
    # Beside, each chunk is counted as it is written; else none while the run goes.
    assert (len(set(seen)) == len(seen)) == beside and len(seen) == 4
    got, meta = read_trace(outcome.output)
    expected = RunSummary()
    for k in range(0, 2000, 500):  # chunk by chunk, as written (float sums depend on the order)
        expected.add({name: column[k:k + 500] for name, column in got.items()})
    assert meta["summary"] == outcome.summary.to_dict() == expected.to_dict()
    assert outcome.summary.total().ios == 2000


def read_trace_columns(path):
    import pyarrow.parquet as pq

    return pq.read_table(path).column("ts_ns").to_pylist()



# ---- the journal's integer columns, stored as differences in narrow types ---------------------

_CLOCKS = ("ts_ns", "intended_ns", "issue_ns", "complete_ns")
_INTS = (*_CLOCKS, "offset", "result")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.tuples(*[st.integers(-2**63, 2**63 - 1)] * len(_INTS)), max_size=20), max_size=4),
       st.sets(st.sampled_from(_INTS)))
def test_the_journal_gives_back_every_integer_it_took_whatever_the_values(tmp_path, chunks, nullable):
    # Any int64, the extremes too (the differences wrap, the sums back wrap again; a batch
    # wider than the stream's types starts another stream); a column given with a null is
    # stored as it is, in that batch only.
    import pyarrow as pa

    writer = _results_writer(tmp_path / f"r{len(list(tmp_path.iterdir()))}.parquet")
    written = []
    for k, rows in enumerate(chunks):
        n = len(rows)
        chunk = {name: np.array([r[j] for r in rows], dtype=np.int64) for j, name in enumerate(_INTS)}
        chunk.update(op=np.zeros(n, np.uint8), length=np.zeros(n, np.int64))
        if k == 1 and n:
            for name in nullable:
                chunk[name] = pa.array([None, *chunk[name][1:].tolist()], pa.int64())
        writer.write(chunk)
        if n:
            written.append({name: pa.array(chunk[name], pa.int64()).to_pylist() for name in _INTS})
    journal_path = writer.keep()
    try:
        schema_, _, batches = read_journal(journal_path)
        got = [b for b in batches if b.num_rows]
        assert all(b.schema == schema_ for b in got)
        assert [{name: b.column(name).to_pylist() for name in _INTS} for b in got] == written
    finally:
        journal_path.unlink()


def _streams(path):
    """Each Arrow IPC stream of a journal: its schema and its batches with their custom metadata."""
    import pyarrow as pa

    found = []
    with pa.OSFile(str(path)) as f:
        while f.tell() < f.size():
            reader = pa.ipc.open_stream(f)
            batches = []
            while True:
                try:
                    batches.append(reader.read_next_batch_with_custom_metadata())
                except StopIteration:
                    break
            found.append((reader.schema, batches))
    return found


def test_the_journal_stores_rising_clocks_as_small_differences_in_narrow_types(tmp_path):
    import pyarrow as pa

    writer = _results_writer(tmp_path / "r.parquet")
    chunk = next(_chunks([1000]))
    chunk["ts_ns"] = chunk["ts_ns"] + 10**15
    writer.write(chunk)
    wider = next(_chunks([10]))
    wider["complete_ns"] = wider["issue_ns"] + 10**6  # a difference that needs int32
    writer.write(wider)
    writer.write(next(_chunks([5])))  # fits the second stream's types
    path = writer.keep()
    (head, empty), (first, (stored,)), (second, later) = _streams(path)
    # The first stream: the results' schema with the run's metadata, and no rows.
    assert head.types[2] == pa.int64() and schema.METADATA_KEY in head.metadata and not empty[0].batch.num_rows
    batch, meta = stored
    ts = chunk["ts_ns"]
    # ts and intended from the row before (the first value in the batch's entry); issue from
    # intended, completion from issue; each column in the narrowest type that holds it.
    assert batch.column("ts_ns").to_pylist() == [0, *np.diff(ts)] and ["ts_ns", None, 10**15] in json.loads(meta[b"diffs"])
    assert batch.column("issue_ns").to_pylist() == [7] * 1000
    np.testing.assert_array_equal(batch.column("complete_ns").to_numpy(), chunk["complete_ns"] - chunk["issue_ns"])
    assert batch.column("offset").to_pylist() == chunk["offset"].tolist()  # not a clock: as it is
    assert dict(zip(first.names, first.types)) == {
        "ts_ns": pa.int16(), "op": pa.uint8(), "offset": pa.int32(), "length": pa.int16(), "intended_ns": pa.int16(),
        "issue_ns": pa.int8(), "complete_ns": pa.int8(), "result": pa.int16()}
    # A wider difference starts a stream whose types are the wider of each; what fits stays in it.
    assert second.field("complete_ns").type == pa.int32() and second.field("offset").type == pa.int32()
    assert [b.batch.num_rows for b in later] == [10, 5]


def test_the_journal_reads_those_of_older_versions(tmp_path):
    import pyarrow as pa

    # Older journals are one stream with every column as int64: the values themselves, or the
    # clocks as differences whose first is the batch's first value.
    chunk = next(_chunks([1000]))
    names = ["ts_ns", "op", "offset", "length", "intended_ns", "issue_ns", "complete_ns", "result"]
    table = pa.table({name: chunk[name] for name in names})
    diffed = dict(chunk, ts_ns=np.diff(chunk["ts_ns"], prepend=0), intended_ns=np.diff(chunk["intended_ns"], prepend=0),
                  issue_ns=chunk["issue_ns"] - chunk["intended_ns"], complete_ns=chunk["complete_ns"] - chunk["issue_ns"])
    for name, batch, custom in [
            ("plain", table.to_batches()[0], None),
            ("diffs", pa.table({name: diffed[name] for name in names}).to_batches()[0],
             {"diffs": json.dumps([["ts_ns", None], ["intended_ns", None], ["issue_ns", "intended_ns"],
                                   ["complete_ns", "issue_ns"]])})]:
        old = tmp_path / f"{name}.partial"
        with pa.OSFile(str(old), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
            w.write_batch(batch, custom)
        (back,) = read_journal(old)[2]
        assert back.equals(table.to_batches()[0]), name
