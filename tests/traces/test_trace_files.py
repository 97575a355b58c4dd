"""Tests of traces.trace: round trips, chunked reads, and one test per validation error."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traces import schema
from traces.errors import TraceFormatError
from traces.schema import Op
from traces.trace import TraceWriter, open_trace, read_trace, write_trace

TRACE_FIELDS = [(f.name, f.type) for f in schema.TRACE_ARROW_SCHEMA]
HYPOTHESIS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def columns(ts, op, offset, length):
    return {
        "ts_ns": np.asarray(ts, dtype=np.int64),
        "op": np.asarray(op, dtype=np.uint8),
        "offset": np.asarray(offset, dtype=np.int64),
        "length": np.asarray(length, dtype=np.int64),
    }


def small_trace(n=10):
    """n valid rows: reads and writes of 4 KiB, every fourth row a flush."""
    op = np.where(np.arange(n) % 4 == 3, Op.FLUSH, np.arange(n) % 2)
    length = np.where(op == Op.FLUSH, 0, 4096)
    return columns(np.arange(n) * 1000, op, np.arange(n) * 4096, length)


def write_raw(path, data, fields=None, metadata=None):
    """Write a Parquet file with no validation at all, to make bad traces."""
    fields = fields or {}
    arrays = {name: pa.array(values, type=fields.get(name)) for name, values in data.items()}
    table = pa.table(arrays)
    if metadata is not None:
        table = table.replace_schema_metadata({schema.METADATA_KEY: json.dumps(metadata)})
    pq.write_table(table, path)
    return path


def raw_trace(path, ts=None, op=None, offset=None, length=None, metadata=None):
    data = small_trace()
    for name, values in (("ts_ns", ts), ("op", op), ("offset", offset), ("length", length)):
        if values is not None:
            data[name] = np.asarray(values, dtype=data[name].dtype)
    return write_raw(path, data, metadata=metadata)


@st.composite
def valid_traces(draw):
    n = draw(st.integers(0, 60))

    def ints(lo, hi):
        return st.lists(st.integers(lo, hi), min_size=n, max_size=n)

    ts = np.cumsum(np.asarray(draw(ints(0, 10**9)), dtype=np.int64))
    op = np.asarray(draw(ints(0, len(Op) - 1)), dtype=np.uint8)
    offset = np.asarray(draw(ints(0, 1 << 50)), dtype=np.int64)
    length = np.asarray(draw(ints(1, (1 << 32) - 1)), dtype=np.int64)
    flush_empty = np.asarray(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    length[(op == Op.FLUSH) & flush_empty] = 0
    trace = columns(ts, op, offset, length)
    if draw(st.booleans()):
        trace["length"] = trace["length"].astype(np.uint32)
    if draw(st.booleans()):
        trace["pid"] = np.asarray(draw(ints(-(2**31), 2**31 - 1)), dtype=np.int32)
        comm = draw(st.lists(st.text(max_size=8), min_size=n, max_size=n))
        trace["comm"] = np.asarray(comm, dtype=object)
    return trace


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


def assert_same_columns(got, want):
    assert sorted(got) == sorted(want)
    for name, values in want.items():
        if values.dtype == object:
            assert list(got[name]) == list(values), name
        else:
            assert got[name].dtype == schema.TRACE_COLUMNS.get(name, values.dtype), name
            np.testing.assert_array_equal(got[name], values, err_msg=name)


# Round trips and chunked reads


@HYPOTHESIS
@given(
    trace=valid_traces(),
    metadata=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
)
def test_write_read_round_trip_is_identity(tmp_path_factory, trace, metadata):
    path = tmp_path_factory.mktemp("rt") / "t.parquet"
    write_trace(path, trace, metadata)
    got, got_metadata = read_trace(path)
    assert_same_columns(got, trace)
    assert got_metadata == {**metadata, "schema_version": schema.SCHEMA_VERSION}


@HYPOTHESIS
@given(
    trace=valid_traces(),
    group_rows=st.integers(1, 25),
    chunk_rows=st.sampled_from([1, 2, 3, 7, 16, 1 << 16]),
)
def test_chunked_reads_agree_with_whole_read(tmp_path_factory, trace, group_rows, chunk_rows):
    path = tmp_path_factory.mktemp("chunks") / "t.parquet"
    fields = [(name, pa.from_numpy_dtype(trace[name].dtype)) for name, _ in TRACE_FIELDS]
    fields += [(n, t) for n, t in schema.OPTIONAL_COLUMNS.items() if n in trace]
    with TraceWriter(path, fields, {}) as writer:
        for start in range(0, len(trace["ts_ns"]), group_rows):
            writer.write({k: v[start:start + group_rows] for k, v in trace.items()})
    whole, _ = read_trace(path)
    chunks = list(open_trace(path).chunks(rows=chunk_rows))
    assert all(len(c["ts_ns"]) <= chunk_rows for c in chunks)
    joined = {
        name: np.concatenate([c[name] for c in chunks]) if chunks else whole[name]
        for name in whole
    }
    assert_same_columns(joined, trace)
    assert_same_columns(whole, trace)


def test_chunks_can_read_a_subset_of_columns(tmp_path):
    trace = small_trace(20)
    write_trace(tmp_path / "t.parquet", trace, {})
    chunks = list(open_trace(tmp_path / "t.parquet").chunks(["offset"], rows=6))
    assert [sorted(c) for c in chunks] == [["offset"]] * 4
    np.testing.assert_array_equal(np.concatenate([c["offset"] for c in chunks]), trace["offset"])


def test_uint32_length_is_accepted_and_read_as_int64(tmp_path):
    trace = small_trace()
    trace["length"] = trace["length"].astype(np.uint32)
    write_trace(tmp_path / "t.parquet", trace, {})
    assert open_trace(tmp_path / "t.parquet").column_names == list(schema.TRACE_COLUMNS)
    got, _ = read_trace(tmp_path / "t.parquet")
    assert got["length"].dtype == np.int64
    np.testing.assert_array_equal(got["length"], trace["length"])


def test_trace_file_facts(tmp_path):
    op = [Op.READ, Op.WRITE, Op.FLUSH, Op.DISCARD]
    trace = columns([0, 5, 9, 9], op, [100, 8192, 0, 4096], [4096, 512, 0, 65536])
    write_trace(tmp_path / "t.parquet", trace, {"name": "facts"})
    t = open_trace(tmp_path / "t.parquet")
    assert (t.num_rows, t.metadata["name"]) == (4, "facts")
    assert t.has("op") and not t.has("pid")
    assert t.span() == 4096 + 65536
    assert t.max_length() == 65536
    assert t.duration_ns() == 9


def test_facts_of_an_empty_trace_are_zero(tmp_path):
    write_trace(tmp_path / "t.parquet", columns([], [], [], []), {})
    t = open_trace(tmp_path / "t.parquet")
    assert (t.num_rows, t.span(), t.max_length(), t.duration_ns()) == (0, 0, 0, 0)
    got, _ = read_trace(tmp_path / "t.parquet")
    assert {name: (len(v), v.dtype) for name, v in got.items()} == {
        name: (0, dtype) for name, dtype in schema.TRACE_COLUMNS.items()
    }


def test_a_parquet_file_without_metadata_is_accepted(tmp_path):
    path = write_raw(tmp_path / "plain.parquet", small_trace())
    t = open_trace(path)
    assert t.metadata == {}
    assert t.num_rows == 10


# Validation: each error names the file, the column and the first bad row


def raises_format_error(path, column=None, row=None, match=None, read=True):
    with pytest.raises(TraceFormatError, match=match) as info:
        if read:
            read_trace(path)
        else:
            open_trace(path)
    err = info.value
    assert err.path == str(path)
    assert (err.column, err.row) == (column, row)
    assert str(path) in str(err)
    return err


@pytest.mark.parametrize("missing", list(schema.TRACE_COLUMNS))
def test_missing_column(tmp_path, missing):
    data = small_trace()
    del data[missing]
    path = write_raw(tmp_path / "t.parquet", data)
    raises_format_error(path, column=missing, match="missing required column", read=False)


@pytest.mark.parametrize(
    "column, arrow_type, found",
    [
        ("ts_ns", pa.float64(), "double"),
        ("op", pa.int64(), "int64"),
        ("offset", pa.uint64(), "uint64"),
        ("length", pa.int32(), "int32"),
    ],
)
def test_wrong_type_names_column_found_and_expected(tmp_path, column, arrow_type, found):
    path = write_raw(tmp_path / "t.parquet", small_trace(), {column: arrow_type})
    err = raises_format_error(path, column=column, read=False)
    expected = pa.from_numpy_dtype(schema.TRACE_COLUMNS[column])
    expected = "int64 or uint32" if column == "length" else expected
    assert f"type {found}, expected {expected}" in err.problem


def test_wrong_type_of_an_optional_column(tmp_path):
    data = {**small_trace(), "pid": np.arange(10, dtype=np.int64)}
    path = write_raw(tmp_path / "t.parquet", data)
    err = raises_format_error(path, column="pid", read=False)
    assert "type int64, expected int32" in err.problem


def test_negative_ts(tmp_path):
    path = raw_trace(tmp_path / "t.parquet", ts=[-5] + list(range(9)))
    raises_format_error(path, column="ts_ns", row=0, match="negative ts_ns -5")


def test_decreasing_ts(tmp_path):
    path = raw_trace(tmp_path / "t.parquet", ts=[0, 1000, 2000, 3000, 5000, 4000, 1, 2, 3, 4])
    raises_format_error(path, column="ts_ns", row=5, match="decreases from 5000 to 4000")


@pytest.mark.parametrize("rows", [1, 4])
def test_decreasing_ts_exactly_at_a_chunk_boundary(tmp_path, rows):
    path = raw_trace(tmp_path / "t.parquet", ts=[0, 10, 20, 30, 25, 40, 50, 60, 70, 80])
    chunks = open_trace(path).chunks(rows=rows)
    with pytest.raises(TraceFormatError, match="decreases from 30 to 25") as info:
        for chunk in chunks:
            assert chunk["ts_ns"][0] != 25  # the bad chunk is never yielded
    assert (info.value.column, info.value.row) == ("ts_ns", 4)


@pytest.mark.parametrize("rows", [None, 2, 3])
def test_decreasing_ts_across_row_groups(tmp_path, rows):
    path = tmp_path / "t.parquet"
    with TraceWriter(path, TRACE_FIELDS, {}) as writer:
        writer.write(columns([0, 10, 20], [0, 0, 0], [0, 0, 0], [512] * 3))
        writer.write(columns([19, 30], [0, 0], [0, 0], [512] * 2))
    assert pq.ParquetFile(path).num_row_groups == 2
    with pytest.raises(TraceFormatError, match="decreases from 20 to 19") as info:
        list(open_trace(path).chunks(rows=rows))
    assert (info.value.path, info.value.column, info.value.row) == (str(path), "ts_ns", 3)


def test_negative_offset(tmp_path):
    path = raw_trace(tmp_path / "t.parquet", offset=[0, 1, 2, 3, 4, 5, 6, -4096, -1, 9])
    raises_format_error(path, column="offset", row=7, match="negative offset -4096")


def test_negative_length(tmp_path):
    path = raw_trace(tmp_path / "t.parquet", length=[1] * 8 + [-512, 1])
    raises_format_error(path, column="length", row=8, match="negative length -512")


@pytest.mark.parametrize("op", [Op.READ, Op.WRITE, Op.DISCARD])
def test_zero_length_read_write_discard(tmp_path, op):
    ops, lengths = [Op.FLUSH] * 6 + [op] * 4, [0] * 7 + [1] * 3
    path = raw_trace(tmp_path / "t.parquet", op=ops, length=lengths)
    raises_format_error(path, column="length", row=6, match=f"{op.name.lower()} with length 0")


def test_flush_may_have_length_zero(tmp_path):
    path = raw_trace(tmp_path / "t.parquet", op=[Op.FLUSH] * 10, length=[0] * 10)
    got, _ = read_trace(path)
    assert (got["length"] == 0).all() and (got["op"] == Op.FLUSH).all()


def test_unknown_op(tmp_path):
    path = raw_trace(tmp_path / "t.parquet", op=[0, 1, 2, 3, 0, 1, 2, 3, 9, 200])
    raises_format_error(path, column="op", row=8, match="unknown op 9")


def test_first_bad_row_wins_over_later_worse_ones(tmp_path):
    offset = [0, 0, 0, -1, 0, 0, 0, 0, 0, 0]
    path = raw_trace(tmp_path / "t.parquet", op=[0] * 9 + [77], offset=offset)
    raises_format_error(path, column="offset", row=3)


def test_nulls_in_required_columns(tmp_path):
    data = small_trace()
    offset = [int(v) for v in data["offset"]]
    offset[6] = None
    data["offset"] = offset
    path = write_raw(tmp_path / "t.parquet", data, {"offset": pa.int64()})
    raises_format_error(path, column="offset", row=6, match="null")


@pytest.mark.parametrize("version", [schema.SCHEMA_VERSION + 1, 99])
def test_unknown_schema_version(tmp_path, version):
    path = raw_trace(tmp_path / "t.parquet", metadata={"schema_version": version})
    err = raises_format_error(path, read=False)
    assert f"schema_version {version}" in err.problem
    assert f"up to {schema.SCHEMA_VERSION}" in err.problem


@pytest.mark.parametrize("metadata", [{"schema_version": "1"}, {"name": "x"}, [1], 7])
def test_bad_metadata(tmp_path, metadata):
    path = raw_trace(tmp_path / "t.parquet", metadata=metadata)
    raises_format_error(path, read=False, match="metadata")


def test_metadata_that_is_not_json(tmp_path):
    table = pa.table(small_trace()).replace_schema_metadata({schema.METADATA_KEY: b"{not json"})
    pq.write_table(table, tmp_path / "t.parquet")
    raises_format_error(tmp_path / "t.parquet", read=False, match="not valid JSON")


def test_a_file_that_is_not_parquet(tmp_path):
    path = tmp_path / "t.parquet"
    path.write_text("ts_ns,op,offset,length\n0,0,0,4096\n")
    raises_format_error(path, read=False, match="not a readable Parquet file")


@pytest.mark.parametrize("keep", [0.0, 0.5, 0.99])
def test_a_truncated_parquet_file(tmp_path, keep):
    whole = tmp_path / "whole.parquet"
    write_trace(whole, small_trace(1000), {})
    data = whole.read_bytes()
    path = tmp_path / "cut.parquet"
    path.write_bytes(data[: int(len(data) * keep)])
    raises_format_error(path, read=False, match="not a readable Parquet file")


def test_a_missing_file(tmp_path):
    raises_format_error(tmp_path / "nope.parquet", read=False, match="no such file")


# Writing


def test_close_merges_extra_metadata(tmp_path):
    path = tmp_path / "r.parquet"
    writer = TraceWriter(path, TRACE_FIELDS, {"name": "run", "source": {"kind": "x"}})
    writer.write(small_trace(4))
    assert not path.exists()
    assert writer.tmp_path.exists() and writer.tmp_path.name.endswith(".partial")
    assert writer.tmp_path.parent == path.parent
    writer.close({"interrupted": True, "summary": {"ios": np.int64(4)}})
    assert not writer.tmp_path.exists()
    _, metadata = read_trace(path)
    assert metadata == {
        "name": "run",
        "source": {"kind": "x"},
        "interrupted": True,
        "summary": {"ios": 4},
        "schema_version": schema.SCHEMA_VERSION,
    }
    # One JSON object under one key; visible to plain pyarrow too.
    assert list(pq.read_schema(path).metadata) == [schema.METADATA_KEY]


def test_writer_writes_result_columns(tmp_path):
    path = tmp_path / "r.parquet"
    fields = TRACE_FIELDS + schema.RESULT_ARROW_FIELDS
    trace = small_trace(5)
    results = {name: np.arange(5, dtype=np.int64) for name in schema.RESULT_COLUMNS}
    with TraceWriter(path, fields, {}) as writer:
        writer.write({**trace, **results})
    got, _ = read_trace(path)
    assert_same_columns(got, {**trace, **results})


@HYPOTHESIS
@given(trace=valid_traces(), write_rows=st.integers(1, 9), group_rows=st.integers(1, 30))
def test_held_writes_make_row_groups_of_group_rows(tmp_path_factory, trace, write_rows, group_rows):
    path = tmp_path_factory.mktemp("groups") / "t.parquet"
    fields = [(name, pa.from_numpy_dtype(trace[name].dtype)) for name, _ in TRACE_FIELDS]
    fields += [(n, t) for n, t in schema.OPTIONAL_COLUMNS.items() if n in trace]
    n = len(trace["ts_ns"])
    with TraceWriter(path, fields, {}, group_rows=group_rows) as writer:
        for start in range(0, n, write_rows):
            writer.write({k: v[start:start + write_rows] for k, v in trace.items()})
    got, _ = read_trace(path)
    assert_same_columns(got, trace)
    # Every group but the last reaches group_rows, and none is larger than it needs to be.
    sizes = [g["num_rows"] for g in pq.ParquetFile(path).metadata.to_dict()["row_groups"]]
    assert sum(sizes) == n and all(size >= group_rows for size in sizes[:-1])
    assert all(size < group_rows + write_rows for size in sizes)


def test_abort_discards_held_rows(tmp_path):
    writer = TraceWriter(tmp_path / "r.parquet", TRACE_FIELDS, {}, group_rows=1000)
    writer.write(small_trace())
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_abort_leaves_no_file(tmp_path):
    writer = TraceWriter(tmp_path / "r.parquet", TRACE_FIELDS, {})
    writer.write(small_trace())
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_exception_in_context_aborts(tmp_path):
    with pytest.raises(RuntimeError):
        with TraceWriter(tmp_path / "r.parquet", TRACE_FIELDS, {}) as writer:
            writer.write(small_trace())
            raise RuntimeError("replay failed")
    assert list(tmp_path.iterdir()) == []


def test_close_in_context_keeps_partial_result(tmp_path):
    path = tmp_path / "r.parquet"
    with pytest.raises(KeyboardInterrupt):
        with TraceWriter(path, TRACE_FIELDS, {}) as writer:
            writer.write(small_trace(3))
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                writer.close({"interrupted": True})
                raise
    assert list(tmp_path.iterdir()) == [path]
    got, metadata = read_trace(path)
    assert metadata["interrupted"] is True and len(got["ts_ns"]) == 3


def test_existing_file_is_replaced_only_at_close(tmp_path):
    path = tmp_path / "t.parquet"
    write_trace(path, small_trace(3), {"name": "old"})
    writer = TraceWriter(path, TRACE_FIELDS, {"name": "new"})
    writer.write(small_trace(7))
    assert open_trace(path).metadata["name"] == "old"
    writer.close()
    assert (open_trace(path).metadata["name"], open_trace(path).num_rows) == ("new", 7)


def test_writer_refuses_mismatched_chunk(tmp_path):
    path = tmp_path / "r.parquet"
    with TraceWriter(path, TRACE_FIELDS, {}) as writer:
        chunk = small_trace()
        del chunk["op"]
        with pytest.raises(TraceFormatError, match=r"missing \['op'\]"):
            writer.write(chunk)
        writer.abort()
    assert not path.exists()


def test_write_trace_refuses_unknown_columns(tmp_path):
    path = tmp_path / "t.parquet"
    with pytest.raises(TraceFormatError, match="unknown column") as info:
        write_trace(path, {**small_trace(), "lba": np.zeros(10, dtype=np.int64)}, {})
    assert (info.value.path, info.value.column) == (str(path), "lba")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "column, values, bad_row, match",
    [
        ("ts_ns", [0, 1, 2, 3, 2, 5, 6, 7, 8, 9], 4, "decreases from 3 to 2"),
        ("offset", [0] * 9 + [-1], 9, "negative offset -1"),
        ("op", [0, 1, 2, 3, 4, 0, 1, 2, 3, 0], 4, "unknown op 4"),
        ("op", [0, 1, 2, 3, 256, 0, 1, 2, 3, 0], 4, "does not fit in uint8"),
        ("length", [0] * 10, 0, "read with length 0"),
    ],
)
def test_write_trace_validates_like_the_reader(tmp_path, column, values, bad_row, match):
    path = tmp_path / "t.parquet"
    trace = small_trace()
    trace[column] = np.asarray(values, dtype=np.int64)
    with pytest.raises(TraceFormatError, match=match) as info:
        write_trace(path, trace, {})
    assert (info.value.path, info.value.column, info.value.row) == (str(path), column, bad_row)
    assert list(tmp_path.iterdir()) == []


def test_write_trace_refuses_float_columns(tmp_path):
    trace = small_trace()
    trace["offset"] = trace["offset"].astype(np.float64)
    with pytest.raises(TraceFormatError, match="dtype float64, expected int64"):
        write_trace(tmp_path / "t.parquet", trace, {})


def test_metadata_must_be_json(tmp_path):
    with pytest.raises(TraceFormatError, match="JSON"):
        write_trace(tmp_path / "t.parquet", small_trace(), {"when": object()})
    assert list(tmp_path.iterdir()) == []
