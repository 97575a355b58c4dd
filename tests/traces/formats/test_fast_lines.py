"""The fast reader of plain delimited lines (native.read_lines, engine/src/text.rs, via
reading.fast_lines) against pyarrow's read_csv, which it stands in for: on any block it reads,
the batch is the one read_csv makes, value for value and bit for bit; on the rest it gives up
(None)."""
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
from hypothesis import given, settings
from hypothesis import strategies as st

from traces.formats.reading import fast_lines

NAMES = ["c0", "c1", "c2", "c3"]
TYPES = {"c0": pa.float64(), "c1": pa.int64(), "c3": pa.float64()}  # c2 is not kept
INCLUDE = ["c3", "c0", "c1"]
# Skipped fields first, in a run of three (passed over by counting commas) and last.
WIDE = ([f"c{i}" for i in range(8)], {"c1": pa.float64(), "c5": pa.int64()}, ["c5", "c1"])
LAYOUTS = [(NAMES, TYPES, INCLUDE), WIDE]


def pyarrow_batch(block: bytes, layout=(NAMES, TYPES, INCLUDE)):
    """read_blocks' own pyarrow read of `block`, or None where pyarrow refuses it."""
    names, types, include = layout
    try:
        table = pacsv.read_csv(
            pa.BufferReader(block), read_options=pacsv.ReadOptions(column_names=names),
            parse_options=pacsv.ParseOptions(quote_char=False, double_quote=False),
            convert_options=pacsv.ConvertOptions(column_types=types, include_columns=include,
                                                 strings_can_be_null=False, null_values=[]))
    except pa.ArrowInvalid:
        return None
    return table.combine_chunks().to_batches()[0] if table.num_rows else None


def same(fast, slow) -> bool:
    """Equal names, types and values, floats compared bit for bit."""
    if fast.schema.names != slow.schema.names or fast.schema.types != slow.schema.types:
        return False
    for a, b in zip(fast.columns, slow.columns):
        a, b = a.to_numpy(), b.to_numpy()
        if a.dtype.kind == "f":
            a, b = a.view(np.int64), b.view(np.int64)
        if not np.array_equal(a, b):
            return False
    return True


def decimal(value: int, places: int) -> str:
    whole, fraction = divmod(value, 10**places)
    return f"{whole}.{fraction:0{places}d}" if places else str(whole)


FIELD = st.one_of(
    st.integers(0, 10**15).flatmap(lambda v: st.integers(0, 3).map(lambda p: decimal(v, p))),
    st.integers(-10**18, 10**18).map(str),
    st.sampled_from(["RD", "WR", "", " 5", "5 ", "+5", "1e3", "nan", "-0.5", ".5", "5.", "0.1234",
                     "00012", "1234567890123456789", "9007199254740.993", "a\rb", "\"x\""]),
)


# A line each layout reads: lines of it before and after the generated ones put those at
# every place in a block (the reader takes a line 16 bytes or more into the block, with 128
# bytes after its start, all at once; the others byte by byte).
PLAIN = {len(NAMES): "1.5,2,x,3", len(WIDE[0]): "a,1.5,b,c,d,7,e,f"}


def blocks(width):
    """Blocks of lines of `width` fields, give or take one, among plain ones."""
    line = st.lists(FIELD, min_size=width - 1, max_size=width + 1).map(",".join)
    return st.tuples(st.lists(line, min_size=1, max_size=8), st.sampled_from(["\n", "\r\n", "\n\n"]),
                     st.booleans(), st.integers(0, 3), st.sampled_from([0, 16])).map(
        lambda t: (t[1].join([PLAIN[width]] * t[3] + t[0] + [PLAIN[width]] * t[4]) + (t[1] if t[2] else "")).encode())


@settings(max_examples=600, deadline=None)
@given(case=st.sampled_from(LAYOUTS).flatmap(lambda layout: st.tuples(st.just(layout), blocks(len(layout[0])))))
def test_a_block_read_fast_is_the_batch_pyarrow_reads(case):
    layout, block = case
    got = fast_lines(*layout)(block)
    if got is not None:
        slow = pyarrow_batch(block, layout)
        assert slow is not None and same(got[0], slow), block
        assert got[1] == block.count(b"\n")


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 2**53 - 1), st.integers(0, 3), st.integers(-2**63 + 1, 2**63 - 1),
                               st.sampled_from(["RD", "WR", "x y", ""]), st.integers(0, 10**12)), min_size=1, max_size=50))
def test_plain_lines_are_read_fast(rows):
    """Decimals of up to three places below 2^53 thousandths and 18-digit integers: the simple
    case, which must not fall back to pyarrow."""
    # t is in thousandths: written with p places, it keeps its first 3 - p digits' worth.
    lines = [f"{decimal(t // 10**(3 - p), p)},{i if abs(i) < 10**18 else 7},{s},{decimal(latency, 3)}" for t, p, i, s, latency in rows]
    block = ("\n".join(lines) + "\n").encode()
    got = fast_lines(NAMES, TYPES, INCLUDE)(block)
    assert got is not None and same(got[0], pyarrow_batch(block)) and got[1] == block.count(b"\n")


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.lists(st.sampled_from(["RD", "x y", "", "-5", "\"q\"", "123456789012"]),
                                        min_size=6, max_size=6),
                               st.integers(0, 10**12), st.integers(-10**17, 10**17)), min_size=1, max_size=50))
def test_runs_of_skipped_fields_are_passed_over(rows):
    """Any text but a comma or a line's end in the skipped fields, short or longer than eight
    bytes, the run of three included: the kept columns are read fast, as pyarrow reads them."""
    lines = [",".join([s[0], decimal(t, 3), s[1], s[2], s[3], str(i), s[4], s[5]]) for s, t, i in rows]
    block = ("\n".join(lines) + "\n").encode()
    got = fast_lines(*WIDE)(block)
    assert got is not None and same(got[0], pyarrow_batch(block, WIDE)) and got[1] == block.count(b"\n")


def test_a_line_that_ends_inside_a_run_of_skipped_fields_falls_back():
    read = fast_lines(*WIDE)
    assert read(b"a,1.5,b,c,d,7,e,f\n") is not None
    for block in (b"a,1.5,b,c\nd,7,e,f\n", b"a,1.5,b,c\r,d,7,e,f\n", b"a,1.5,bbbbbbbbbbbb\n",
                  b"a,1.5,bbbb\nccc,ddd,eee,7,e,f\n", b"a,1.5,bbbb\rccc,ddd,eee,7,e,f\n",
                  b"a,1.5,b,c,d", b"a,1.5,b,c,d,7,e\n", b"a,1.5,b,c,d,7,e,f,g\n"):
        assert read(block) is None, block


def test_what_the_reader_does_not_read_falls_back():
    read = fast_lines(NAMES, TYPES, INCLUDE)
    assert read(b"1.5,2,x,3\n") is not None
    for block in (b"1.5,2,x\n", b"1.5,2,x,3,4\n", b"1.5,2,x,nan\n", b"1.5, 2,x,3\n", b"1.5,2,x,3\r4\n",
                  b"1.5e3,2,x,3\n", b"1.5,2,x,3.1234\n", b"-1.5,2,x,3\n", b"1.5,,x,3\n"):
        assert read(block) is None, block


def test_other_column_types_have_no_fast_reader():
    assert fast_lines(NAMES, {**TYPES, "c2": pa.string()}, [*INCLUDE, "c2"]) is None


def test_a_large_block_read_in_two_halves_is_the_batch_pyarrow_reads():
    """Blocks of 1 MiB and more are parsed in two halves at once; joined, they are one batch."""
    rng = np.random.default_rng(5)
    n = 30_000
    t = np.cumsum(rng.integers(0, 10**6, n))
    lines = [f"{a // 1000}.{a % 1000:03d},{b},RD,{c // 1000}.{c % 1000:02d}"
             for a, b, c in zip(t.tolist(), rng.integers(-10**18 + 1, 10**18, n).tolist(),
                                rng.integers(0, 10**9, n).tolist())]
    block = ("\n".join(lines) + "\n").encode()
    assert len(block) >= 1 << 20
    read = fast_lines(NAMES, TYPES, INCLUDE)
    got = read(block)
    assert got is not None and same(got[0], pyarrow_batch(block)) and got[1] == n
    # A line the reader does not read, in the second half: the whole block falls back.
    lines[-10] = lines[-10].replace("RD,", "RD,nan,")
    assert read(("\n".join(lines) + "\n").encode()) is None
