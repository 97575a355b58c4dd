"""Imports of the shapes real trace files take in the wild (tests/data/wild: hand-made files in
each format, expected rows computed by hand in this file), and the committed corpus of
importer failures (tests/data/bad/import-*) through the real CLI: exit 2, one error line
naming the input file and line, no traceback, nothing left behind.
"""
import gzip
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli_process import replay_cli
from traces.convert import import_trace
from traces.errors import TraceFormatError
from traces.formats import blkparse
from traces.schema import Flag, Op
from traces.trace import read_trace

DATA = Path(__file__).resolve().parents[2] / "data"
WILD, BAD = DATA / "wild", DATA / "bad"
R, W, D, F = Op.READ, Op.WRITE, Op.DISCARD, Op.FLUSH
SYNC, FUA, META, AHEAD = Flag.SYNC, Flag.FUA, Flag.META, Flag.READAHEAD


def _import(tmp_path, name, *args):
    out = tmp_path / "out.parquet"
    done = replay_cli("import", WILD / name, "-o", out, *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    cols, meta = read_trace(out)
    return {k: v.tolist() for k, v in cols.items()}, meta, done


def _rows(cols, names):
    return [tuple(cols[n][i] for n in names) for i in range(len(cols["ts_ns"]))]


# ---------------------------------------------------------------- real-world shapes


def test_blkparse_barriers_of_kernels_before_2_6_37(tmp_path):
    """WBS (write, barrier, sync): a pre-flush then the write with FUA, as 2.6.37 replaced
    barriers; an empty WBS is a flush. RA, WSM and D map to their flags and ops."""
    cols, meta, _ = _import(tmp_path, "blkparse-barriers-2.6.32.txt")
    names = ("ts_ns", "op", "offset", "length", "latency_ns", "pid", "flags")
    # The trace starts at its first I/O (the first D, 5 us after blkparse's first event).
    assert _rows(cols, names) == [
        (0, F, 0, 0, 395_000, 1234, SYNC),
        (0, W, 2048 * 512, 8 * 512, 395_000, 1234, SYNC | FUA),
        (997_000, R, 4096 * 512, 16 * 512, 298_000, 4321, 0),
        (1_996_000, R, 8192 * 512, 32 * 512, 499_000, 4321, AHEAD),
        (2_996_000, W, 100 * 512, 8 * 512, 199_000, 1234, SYNC | META),
        (3_996_000, D, 65536 * 512, 2048 * 512, 899_000, 555, 0),
        (5_997_000, F, 0, 0, 298_000, 1234, SYNC),
    ]
    assert meta["source"]["time_origin_ns"] == 5_000
    assert cols["comm"] == ["kjournald"] * 2 + ["mysqld"] * 2 + ["kjournald", "fstrim", "kjournald"]
    assert meta["source"]["unmatched_ios"] == 0


# (RWBS, op, flags) for one 8-sector I/O; an empty one for the flushes.
RWBS = [
    ("R", R, 0), ("W", W, 0), ("RS", R, SYNC), ("RA", R, AHEAD), ("RM", R, META),
    ("WS", W, SYNC), ("WFS", W, FUA | SYNC), ("WFSM", W, FUA | SYNC | META), ("D", D, 0),
    ("DE", D, 0), ("WBS", W, FUA | SYNC), ("RBS", R, FUA | SYNC), ("WB", W, FUA),
]


@pytest.mark.parametrize("rwbs,op,flags", RWBS, ids=[r[0] for r in RWBS])
def test_every_rwbs_letter_maps_to_op_and_flags(tmp_path, rwbs, op, flags):
    path = tmp_path / "one.txt"
    path.write_text(f"  8,0 0 1 0.000000000 7 D {rwbs:>3} 64 + 8 [x]\n"
                    f"  8,0 0 2 0.000100000 0 C {rwbs:>3} 64 + 8 [0]\n")
    cols, _ = blkparse_rows(path)
    barrier = "B" in rwbs and op == W  # a pre-flush belongs to a write only
    expected = ([(0, F, 0, 0, flags & SYNC)] if barrier else []) + [(0, op, 64 * 512, 4096, flags)]
    assert _rows(cols, ("ts_ns", "op", "offset", "length", "flags")) == expected


@pytest.mark.parametrize("rwbs,flags", [("FN", 0), ("FF", 0), ("F", 0), ("FWS", SYNC), ("FWFS", SYNC | FUA), ("WBS", SYNC)])
def test_empty_flush_shapes_are_flushes(tmp_path, rwbs, flags):
    path = tmp_path / "flush.txt"
    path.write_text(f"  8,0 0 1 0.000000000 7 D {rwbs:>3} [x]\n  8,0 0 2 0.000100000 0 C {rwbs:>3} 0 [0]\n")
    cols, _ = blkparse_rows(path)
    assert _rows(cols, ("op", "offset", "length", "latency_ns", "flags")) == [(F, 0, 0, 100_000, flags)]


@pytest.mark.parametrize("rwbs", ["X", "WW", "WSS", "SW", "E", "WE", "FFFF", "B"])
def test_what_is_not_rwbs_is_refused_with_its_line(tmp_path, rwbs):
    path = tmp_path / "bad.txt"
    path.write_text(f"  8,0 0 1 0.000000000 7 D R 0 + 8 [x]\n  8,0 0 2 0.000000000 7 D {rwbs} 64 + 8 [x]\n")
    with pytest.raises(Exception, match=f"line 2: unknown RWBS '{rwbs}'"):
        blkparse_rows(path)


def blkparse_rows(path, **options):
    metadata, chunks = blkparse.read([path], options)
    parts = list(chunks)
    return {n: np.concatenate([p[n] for p in parts]).tolist() for n in parts[0]}, metadata


def test_blkparse_piped_live_with_cpus_interleaved(tmp_path):
    """Times go back by microseconds between CPUs; sorted within the window, times count
    from the first I/O (2 us after the earliest event, the third line), each D pairs with its C."""
    cols, meta, _ = _import(tmp_path, "blkparse-live-interleaved-cpus.txt")
    assert _rows(cols, ("ts_ns", "op", "offset", "length", "latency_ns", "pid", "flags")) == [
        (0, R, 1000 * 512, 4096, 148_000, 2001, 0),
        (1_699_000, W, 6000 * 512, 4096, 199_000, 2002, 0),
        (1_949_000, W, 7000 * 512, 4096, 149_000, 2002, SYNC),
        (1_999_000, R, 1008 * 512, 4096, 299_000, 2001, 0),
    ]


def test_spc_optional_fields_vary_per_record(tmp_path):
    cols, meta, _ = _import(tmp_path, "Financial1-optional-fields.spc", "--format", "umass")
    assert _rows(cols, ("ts_ns", "op", "offset", "length", "device")) == [
        (0, W, 20941264 * 512, 8192, 0),
        (2_335_000, W, 20939840 * 512, 8192, 0),
        (4_359_000, R, 3436288 * 512, 15872, 1),
        (5_146_000, W, 20939856 * 512, 4096, 0),
    ]
    assert meta["source"]["time_origin_ns"] == 551_706_000


def test_disksim_milliseconds_and_hex_flags(tmp_path):
    cols, meta, _ = _import(tmp_path, "disksim-ms.trace", "--time-unit", "ms")
    assert _rows(cols, ("ts_ns", "op", "offset", "length")) == [
        (0, R, 1024 * 512, 8 * 512),
        (1_250_000, W, 2048 * 512, 16 * 512),
        (2_500_500, R, 1024 * 512, 8 * 512),  # flags 0x5: bit 0 set
        (3_750_000, W, 99999 * 512, 256 * 512),  # flags 8: bit 0 clear
    ]
    assert "device" not in cols
    assert meta["source"]["kind"] == "import:disksim" and meta["source"]["time_unit"] == "ms"


def test_mqsim_nanoseconds(tmp_path):
    cols, meta, _ = _import(tmp_path, "mqsim-ns.trace", "--format", "disksim", "--time-unit", "ns")
    assert _rows(cols, ("ts_ns", "op", "offset", "length")) == [
        (0, W, 524288 * 512, 16 * 512),
        (13_000, W, 524304 * 512, 16 * 512),
        (20_000, R, 524320 * 512, 16 * 512),
        (35_000, W, 524336 * 512, 16 * 512),
    ]
    assert meta["source"]["time_origin_ns"] == 4_851_300  # the idle time before the first I/O


def test_blkreplay_load_after_its_header(tmp_path):
    cols, meta, _ = _import(tmp_path, "webserver.load")
    assert _rows(cols, ("ts_ns", "op", "offset", "length")) == [
        (0, W, 25166090 * 512, 8 * 512),
        (234_112 - 158_633, R, 983104 * 512, 32 * 512),
        (1_003_001 - 158_633, W, 25166098 * 512, 8 * 512),
        (1_500_000_000 - 158_633, R, 983136 * 512, 256 * 512),
    ]
    assert meta["source"]["format"] == "blkreplay"


def test_blkreplay_reads_the_first_letter_of_a_longer_op_as_blkreplay_does(tmp_path):
    """A MySQL server's load carries RA (read-ahead) among R and W: sscanf's %c keeps R."""
    path = tmp_path / "mysql.load"
    path.write_text("start ; sector; length ; op ;  replay_delay=0 ; replay_duration=0\n"
                    "100.000000000 ; 64 ; 8 ; RA ; 0.0 ; 0.0\n"
                    "100.000001000 ; 72 ; 8 ; W ; 0.0 ; 0.0\n"
                    "100.000002000 ; 80 ; 8 ; R ; 0.0 ; 0.0\n"
                    "100.000003000 ; 88 ; 8 ; WS ; 0.0 ; 0.0\n")
    out, rows = import_trace([path], tmp_path / "m.parquet")
    cols, _ = read_trace(out)
    assert cols["op"].tolist() == [R, W, R, W]
    path.write_text(path.read_text().replace("WS", "XW"))
    with pytest.raises(TraceFormatError, match="line 5: unknown operation 'XW'; expected one of R, W"):
        import_trace([path], tmp_path / "m.parquet", force=True)


def test_drop_outliers_leaves_out_a_glitched_record(tmp_path):
    cols, meta, done = _import(tmp_path, "hm_0-glitched-record.csv", "--drop-outliers")
    assert _rows(cols, ("ts_ns", "op", "offset", "latency_ns")) == [
        (0, R, 0, 1_000), (1_000_000, W, 4096, 2_000), (2_000_000, R, 8192, 3_000),
        (3_000_000, W, 16384, 5_000)]
    assert meta["dropped_outliers"]["count"] == 1
    assert meta["dropped_outliers"]["first"] == ["hm_0-glitched-record.csv:4"]
    assert "left out 1 record" in done.stdout and "hm_0-glitched-record.csv:4" in done.stdout


@pytest.mark.parametrize("glitch", [1_000, 2 * 10**18], ids=["earlier", "later"])
def test_drop_outliers_moves_the_origin_past_a_glitched_first_record(tmp_path, glitch):
    """The times count from the first record: a glitched one, far before or after the rest,
    is left out and the times count from the second (5,000 ns + 10^18)."""
    path = tmp_path / "fiu.txt"
    path.write_text("".join(f"{t} 1 p {i} 8 R 8 0 x\n" for i, t in enumerate(
        [glitch, 10**18 + 5_000, 10**18 + 7_000, 10**18 + 12_000])))
    out = tmp_path / "f.parquet"
    done = replay_cli("import", path, "-o", out, cwd=tmp_path)
    assert done.returncode == 2 and f"{path}: line 1: this record's time is" in done.stderr, done.stderr
    done = replay_cli("import", path, "-o", out, "--drop-outliers", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    cols, meta = read_trace(out)
    assert cols["ts_ns"].tolist() == [0, 2_000, 7_000]
    assert cols["offset"].tolist() == [512, 1024, 1536]
    assert meta["dropped_outliers"]["first"] == ["fiu.txt:1"]


def test_verify_flags_a_40_year_trace(tmp_path):
    from traces.trace import write_trace

    trace = write_trace(tmp_path / "t.parquet", {
        "ts_ns": np.array([0, 1_000, 1_270_000_000 * 10**9]), "op": np.zeros(3, np.uint8),
        "offset": np.zeros(3, np.int64), "length": np.full(3, 4096)}, {})
    done = replay_cli("traces", "verify", trace)
    assert done.returncode == 1, done.stdout
    assert "row 2" in done.stdout and "40.2 years" in done.stdout


# ---------------------------------------------------------------- the corpus of failures


def _truncated_line() -> int:
    """The line in which the truncated .gz stops, by zlib alone (not the code under test)."""
    data = zlib.decompressobj(31).decompress((BAD / "import-blkparse-truncated.txt.gz").read_bytes())
    return data.count(b"\n") + 1


EMPTY = "the file is empty: there is nothing to import"
# file: (extra arguments, the words of the one error line). Every import-* file is here.
FAILURES = {
    "import-blkparse-unknown-rwbs.txt": ([], "line 2: unknown RWBS 'WX'"),
    "import-blkparse-late-event.txt": ([], "line 3: time goes back by 2.499600 s, more than the reorder window"),
    "import-blkparse-glitched-time.txt": ([], "line 5: this record's time is 40.2 years away"),
    "import-blkparse-queue-without-q.txt": (["--event", "queue"], "no Q events; this trace has D/C only: use --event issue"),
    "import-blkparse-issue-without-d.txt": ([], "no D events; this trace has Q/G only: use --event queue"),
    "import-blkparse-truncated.txt.gz": (["--format", "blkparse"], f"line {_truncated_line()}: the gzip data stops here"),
    "import-msr-glitch-at-end.csv": ([], "line 4: this record's time is 40.2 years away"),
    "import-fiu-glitch-at-end.txt": ([], "line 3: this record's time is 40.2 years away"),
    "import-umass-bad-lba.spc": (["--format", "umass"], "line 3: field 2 is 'x3436288'"),
    "import-umass-too-few-fields.spc": (["--format", "umass"], "line 2: expected at least 5 fields"),
    "import-disksim-bad-flags.trace": (["--format", "disksim", "--time-unit", "ms"], "line 2: flags 'zz' is not a hexadecimal"),
    "import-disksim-no-time-unit.trace": ([], "give --time-unit ms for DiskSim, ns for MQSim"),
    "import-blkreplay-bad-op.load": ([], "line 4: unknown operation 'X'"),
    # hfplayer reads "4k" as 4096 blocks; the import refuses it, naming the line.
    "import-netapp-multiplier-suffix.csv": ([], "line 3: field 11 is '4k', expected an integer"),
    "import-blkreplay-header-only.load": (["--format", "blkreplay"], "no request lines"),
    # Two glitched records are no lone outlier: the backstop on the I/Os refuses the gap.
    "import-umass-two-glitched-records.spc": (["--format", "umass"], "I/O 3 comes 115.7 days after the one before it"),
    **{f"import-{fmt}-empty.{ext}": (["--format", fmt] + (["--time-unit", "ms"] if fmt == "disksim" else []), EMPTY)
       for fmt, ext in [("msr", "csv"), ("fiu", "txt"), ("alibaba", "csv"), ("umass", "spc"), ("blkparse", "txt"),
                        ("tencent", "csv"), ("disksim", "trace"), ("blkreplay", "load"), ("fio", "iolog"), ("csv", "csv"),
                        ("netapp", "csv")]},
}
# Refusals about the whole file (or an option), where no line is at fault.
WHOLE_FILE = ("no Q events", "no D events", "give --time-unit", "no request lines", EMPTY, "I/O 3 comes")


def test_every_import_failure_in_the_corpus_has_its_expectation():
    assert sorted(p.name for p in BAD.glob("import-*")) == sorted(FAILURES)


@pytest.mark.parametrize("name", sorted(FAILURES))
def test_bad_import_is_one_error_line_naming_file_and_line(tmp_path, name):
    args, words = FAILURES[name]
    out = tmp_path / "out.parquet"
    done = replay_cli("import", BAD / name, "-o", out, *args, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert words in lines[0], lines[0]
    if not any(w in words for w in WHOLE_FILE):
        assert f"{BAD / name}: line " in lines[0], lines[0]
    elif "--time-unit" not in words:
        assert str(BAD / name) in lines[0], lines[0]
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_truncated_gz_names_the_line_wherever_the_cut_is(tmp_path):
    text = "".join(f"  8,0 0 {i} 0.{i:09d} 7 Q R {8 * i} + 8 [x]\n" for i in range(1, 4000)).encode()
    packed = gzip.compress(text)
    for cut in (len(packed) // 4, len(packed) // 2, len(packed) - 9):
        path = tmp_path / f"cut{cut}.txt.gz"
        path.write_bytes(packed[:cut])
        stop = zlib.decompressobj(31).decompress(packed[:cut]).count(b"\n") + 1
        with pytest.raises(Exception, match=f"line {stop}: the gzip data stops here.*truncated"):
            blkparse_rows(path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300), fmt=st.sampled_from(["disksim", "blkreplay", "umass", "blkparse"]))
def test_garbage_is_a_trace_format_error_never_a_traceback(tmp_path_factory, data, fmt):
    tmp = tmp_path_factory.mktemp("garbage")
    path = tmp / "garbage.txt"
    path.write_bytes(data)
    out = tmp / "out.parquet"
    try:
        import_trace([path], out, fmt, {"time_unit": "ms"})
    except TraceFormatError as e:
        assert str(path) in str(e)
        assert not out.exists()
    assert not list(tmp.glob("*.partial")) and not list(tmp.glob(".*.partial"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 2**40), st.integers(1, 2**16),
                               st.booleans()), min_size=1, max_size=30))
def test_disksim_and_blkreplay_rows_import_as_written(tmp_path_factory, rows):
    tmp = tmp_path_factory.mktemp("rows")
    times = np.cumsum([r[0] for r in rows])
    sim, load = tmp / "t.trace", tmp / "t.load"
    sim.write_text("".join(f"{t} 3 {s} {n} {int(rd)}\n" for t, (_, s, n, rd) in zip(times, rows)))
    load.write_text("header\n" + "".join(f"{t // 10**9}.{t % 10**9:09d} ; {s} ; {n} ; {'R' if rd else 'W'} ; 0.0 ; 0.0\n"
                                         for t, (_, s, n, rd) in zip(times + 10**9, rows)))
    for path, fmt, origin in ((sim, "disksim", times[0]), (load, "blkreplay", times[0] + 10**9)):
        cols, meta = read_trace(import_trace([path], tmp / f"{fmt}.parquet", fmt, {"time_unit": "ns"})[0])
        assert cols["ts_ns"].tolist() == (times - times[0]).tolist()
        assert meta["source"]["time_origin_ns"] == origin
        assert cols["offset"].tolist() == [r[1] * 512 for r in rows]
        assert cols["length"].tolist() == [r[2] * 512 for r in rows]
        assert cols["op"].tolist() == [R if r[3] else W for r in rows]


@pytest.mark.parametrize("kind", ["gz", "xz", "zst"])
def test_truncated_compressed_csv_names_the_line_and_says_truncated(tmp_path, kind):
    import lzma

    import zstandard

    text = "".join(f"{128166372000000000 + 10 * i},hm,0,Read,{i * 4096},4096,5\n" for i in range(50000)).encode()
    pack, unpack = {
        "gz": (gzip.compress, lambda d: zlib.decompressobj(31).decompress(d)),
        "xz": (lzma.compress, lambda d: lzma.LZMADecompressor().decompress(d)),
        "zst": (lambda d: zstandard.ZstdCompressor(write_content_size=False).compress(d),
                lambda d: zstandard.ZstdDecompressor().decompressobj().decompress(d)),
    }[kind]
    cut = pack(text)[: len(pack(text)) // 2]
    path = tmp_path / f"hm_0.csv.{kind}"
    path.write_bytes(cut)
    stop = unpack(cut).count(b"\n") + 1
    with pytest.raises(TraceFormatError, match=rf"{path}: line {stop}: the \w+ data stops here, at the end "
                                               rf"of the {len(cut)}-byte file.*truncated"):
        import_trace([path], tmp_path / "out.parquet", "msr")
    assert not (tmp_path / "out.parquet").exists()


def test_drop_outliers_keeps_the_wallclock_of_the_first_kept_record(tmp_path):
    path = tmp_path / "hm_0.csv"
    path.write_text("100000000000000000,hm,0,Read,0,4096,10\n128166372000010000,hm,0,Write,4096,4096,20\n"
                    "128166372000020000,hm,0,Read,8192,8192,30\n")
    out, rows = import_trace([path], tmp_path / "o.parquet", "msr", {"drop_outliers": True})
    cols, meta = read_trace(out)
    assert cols["ts_ns"].tolist() == [0, 1_000_000]
    # FILETIME 128166372000010000 = 12816637200.001 s since 1601 = 1172163600.001 s since 1970.
    assert meta["start_wallclock"] == "2007-02-22T17:00:00.001000+00:00"


@pytest.mark.parametrize("name,fmt", [
    ("blkparse-barriers-2.6.32.txt", "blkparse"), ("blkparse-live-interleaved-cpus.txt", "blkparse"),
    ("Financial1-optional-fields.spc", "umass"), ("disksim-ms.trace", "disksim"), ("mqsim-ns.trace", "disksim"),
    ("webserver.load", "blkreplay"), ("hm_0-glitched-record.csv", "msr")])
def test_each_shape_is_recognised_as_its_format_and_no_other(name, fmt):
    from traces import formats
    from traces.convert import sniff
    from traces.formats.inputs import read_head

    assert sniff(WILD / name) == fmt
    head = read_head(WILD / name)
    assert [n for n in formats.NAMES if formats.get(n).sniff(WILD / name, head)] == [fmt]


@pytest.mark.parametrize("name,args", [
    ("blkparse-barriers-2.6.32.txt", []), ("Financial1-optional-fields.spc", ["--format", "umass"]),
    ("disksim-ms.trace", ["--time-unit", "ms"]), ("mqsim-ns.trace", ["--format", "disksim", "--time-unit", "ns"]),
    ("webserver.load", []), ("hm_0-glitched-record.csv", ["--drop-outliers"])])
def test_every_import_starts_at_its_first_io_and_records_the_origin(tmp_path, name, args):
    cols, meta, _ = _import(tmp_path, name, *args)
    assert cols["ts_ns"][0] == 0
    assert isinstance(meta["source"]["time_origin_ns"], int)
