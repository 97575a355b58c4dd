"""Text trace formats: real fio iologs in and out of the real fio, hypothesis round trips,
each public CSV layout, compressed inputs, and malformed input named by file and line.
"""
import gzip
import json
import lzma
import shutil
import subprocess

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traces.convert import export_trace, import_trace, sniff
from traces.errors import TraceFormatError
from traces.schema import Op
from traces.trace import read_trace, write_trace

needs_fio = pytest.mark.skipif(shutil.which("fio") is None, reason="needs fio (Debian package fio)")
FAST = settings(max_examples=25, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def _fio(*args, cwd):
    done = subprocess.run(["fio", *map(str, args), "--output-format=json"], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout[done.stdout.index("{"):])["jobs"][0]


# ---------------------------------------------------------------- fio: the real tool


@needs_fio
def test_real_fio_write_iolog_imports_every_io(tmp_path):
    data, log = tmp_path / "data", tmp_path / "job.iolog"
    job = _fio("--name=rec", f"--filename={data}", "--size=4M", "--rw=randrw", "--bs=4k",
               "--ioengine=psync", "--number_ios=300", "--fsync=7", f"--write_iolog={log}", cwd=tmp_path)
    assert log.read_text().startswith("fio version 3 iolog\n")
    assert sniff(log) == "fio"
    out, rows = import_trace([log], tmp_path / "job.parquet")
    cols, meta = read_trace(out)
    # Reference: the same log read the plain way.
    expected = [line.split() for line in log.read_text().splitlines()[1:] if len(line.split()) == 5]
    assert rows == len(expected) > 300
    words = {"read": Op.READ, "write": Op.WRITE, "sync": Op.FLUSH}
    assert cols["op"].tolist() == [words[e[2]] for e in expected]
    assert cols["offset"].tolist() == [int(e[3]) for e in expected]
    assert cols["length"].tolist() == [int(e[4]) for e in expected]
    # The trace starts at its first I/O; the log's time of that I/O is the recorded origin.
    assert cols["ts_ns"].tolist() == [(int(e[0]) - int(expected[0][0])) * 1000 for e in expected]
    assert meta["source"]["time_origin_ns"] == int(expected[0][0]) * 1000
    assert np.count_nonzero(cols["op"] == Op.READ) == job["read"]["total_ios"]
    assert np.count_nonzero(cols["op"] == Op.WRITE) == job["write"]["total_ios"]
    assert int(cols["length"][cols["op"] == Op.WRITE].sum()) == job["write"]["io_bytes"]
    assert meta["source"]["kind"] == "import:fio" and meta["source"]["inputs"] == ["job.iolog"]
    assert "device" not in cols


@needs_fio
def test_our_fio_export_is_replayed_by_fio(tmp_path):
    rng = np.random.default_rng(3)
    n = 400
    op = rng.choice([Op.READ, Op.WRITE, Op.FLUSH], n, p=[0.5, 0.4, 0.1]).astype(np.uint8)
    length = np.where(op == Op.FLUSH, 0, rng.choice([4096, 8192, 65536], n))
    offset = np.where(op == Op.FLUSH, 0, rng.integers(0, 256, n) * 4096)
    ts = np.cumsum(rng.integers(0, 50_000, n))
    trace = write_trace(tmp_path / "t.parquet", {"ts_ns": ts, "op": op, "offset": offset, "length": length}, {})
    iolog = export_trace(trace, "fio", tmp_path / "t.iolog")
    target = tmp_path / "target.img"
    with open(target, "wb") as f:
        f.truncate(2 << 20)
    job = _fio("--name=replay", f"--read_iolog={iolog}", f"--replay_redirect={target}",
               "--ioengine=psync", "--replay_no_stall=1", cwd=tmp_path)
    reads, writes = op == Op.READ, op == Op.WRITE
    assert job["read"]["total_ios"] == np.count_nonzero(reads)
    assert job["read"]["io_bytes"] == int(length[reads].sum())
    assert job["write"]["total_ios"] == np.count_nonzero(writes)
    assert job["write"]["io_bytes"] == int(length[writes].sum())
    assert job["sync"]["total_ios"] == np.count_nonzero(op == Op.FLUSH)


def test_fio_v2_waits_set_the_time_and_files_become_devices(tmp_path):
    log = tmp_path / "v2.log"
    log.write_text("fio version 2 iolog\n/dev/a add\n/dev/b add\n/dev/a open\n/dev/b open\n"
                   "/dev/a write 0 4096\n/dev/a wait 250\n/dev/b read 8192 512\n/dev/b trim 0 1048576\n"
                   "/dev/a wait 1000\n/dev/a sync\n/dev/a datasync 0 0\n/dev/a close\n/dev/b close\n")
    cols, meta = read_trace(import_trace([log], tmp_path / "v2.parquet")[0])
    assert cols["ts_ns"].tolist() == [0, 250_000, 250_000, 1_250_000, 1_250_000]
    assert cols["op"].tolist() == [Op.WRITE, Op.READ, Op.DISCARD, Op.FLUSH, Op.FLUSH]
    assert cols["device"].tolist() == [0, 1, 1, 0, 0]
    assert cols["length"].tolist() == [4096, 512, 1048576, 0, 0]
    assert meta["source"]["files"] == {"/dev/a": 0, "/dev/b": 1}


# At least one row: an import of no I/O at all is refused.
trace_rows = st.integers(1, 60).flatmap(lambda n: st.fixed_dictionaries({
    "gaps": st.lists(st.integers(0, 10**6), min_size=n, max_size=n),
    "ops": st.lists(st.sampled_from([Op.READ, Op.WRITE, Op.DISCARD, Op.FLUSH]), min_size=n, max_size=n),
    "offsets": st.lists(st.integers(0, 2**50), min_size=n, max_size=n),
    "lengths": st.lists(st.integers(1, 2**31), min_size=n, max_size=n),
    "devices": st.lists(st.integers(0, 2), min_size=n, max_size=n),
    "pids": st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n),
    "comms": st.lists(st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=16),
                      min_size=n, max_size=n),
}))


def _columns(rows, scale=1):
    op = np.array(rows["ops"], dtype=np.uint8)
    return {
        "ts_ns": np.cumsum(np.array(rows["gaps"], dtype=np.int64)) * scale,
        "op": op,
        "offset": np.array(rows["offsets"], dtype=np.int64),
        "length": np.where(op == Op.FLUSH, 0, np.array(rows["lengths"], dtype=np.int64)),
        "device": np.array(rows["devices"], dtype=np.uint32),
    }


@FAST
@given(rows=trace_rows)
def test_csv_export_then_import_is_the_identity(tmp_path_factory, rows):
    tmp = tmp_path_factory.mktemp("csv")
    cols = _columns(rows)
    cols["pid"] = np.array(rows["pids"], dtype=np.int32)
    cols["comm"] = np.array(rows["comms"], dtype=object)
    trace = write_trace(tmp / "a.parquet", cols, {})
    exported = export_trace(trace, "csv", tmp / "a.csv")
    back, meta = read_trace(import_trace([exported], tmp / "b.parquet", "csv")[0])
    assert back.keys() == cols.keys()
    back["ts_ns"] = back["ts_ns"] + meta["source"]["time_origin_ns"]  # the trace starts at its first I/O
    for name, values in cols.items():
        assert back[name].tolist() == values.tolist(), name
    assert meta["source"]["kind"] == "import:csv"


@FAST
@given(rows=trace_rows)
def test_fio_export_then_import_is_the_identity(tmp_path_factory, rows):
    tmp = tmp_path_factory.mktemp("fio")
    cols = _columns(rows, scale=1000)  # fio logs keep microseconds
    trace = write_trace(tmp / "a.parquet", cols, {})
    exported = export_trace(trace, "fio", tmp / "a.iolog")
    back, meta = read_trace(import_trace([exported], tmp / "b.parquet")[0])
    back["ts_ns"] = back["ts_ns"] + meta["source"]["time_origin_ns"]  # the trace starts at its first I/O
    for name in ("ts_ns", "op", "offset", "length"):
        assert back[name].tolist() == cols[name].tolist(), name
    used = sorted(set(rows["devices"]))
    if len(used) > 1:  # devices come back numbered in order of first appearance in the log
        assert back["device"].tolist() == [used.index(d) for d in cols["device"].tolist()]
    else:
        assert "device" not in back


# ---------------------------------------------------------------- the public CSV layouts

FILETIME_2007 = 128166372000000000
US_2020 = 1_577_836_800_000_000
S_2018 = 1_538_352_000

io_rows = st.lists(st.tuples(st.integers(0, 5000), st.booleans(), st.integers(0, 2**40),
                             st.integers(1, 2**20), st.integers(0, 3)), max_size=40)


def _times(rows):
    return np.cumsum([r[0] for r in rows]).astype(np.int64)


@FAST
@given(rows=io_rows.filter(bool))
def test_msr_rows_import_to_expected_columns(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("msr") / "hm_0.csv"
    t = _times(rows)
    path.write_text("".join(f"{FILETIME_2007 + ti},hm,0,{'Write' if w else 'Read'},{o},{s},{r * 10}\n"
                            for ti, (_, w, o, s, r) in zip(t, rows)))
    assert sniff(path) == "msr"
    cols, meta = read_trace(import_trace([path], path.with_suffix(".parquet"))[0])
    assert cols["ts_ns"].tolist() == ((t - t[0]) * 100).tolist()
    assert meta["source"]["time_origin_ns"] == (FILETIME_2007 + int(t[0]) - 116444736000000000) * 100
    assert cols["op"].tolist() == [Op.WRITE if r[1] else Op.READ for r in rows]
    assert cols["offset"].tolist() == [r[2] for r in rows]
    assert cols["length"].tolist() == [r[3] for r in rows]
    assert cols["latency_ns"].tolist() == [r[4] * 1000 for r in rows]
    assert meta["source"]["hostname"] == "hm" and meta["source"]["disk"] == 0
    assert meta["start_wallclock"].startswith("2007-02-22")
    assert "SNIA" in meta["provenance"]


@FAST
@given(rows=io_rows.filter(bool), concat=st.booleans())
def test_umass_rows_import_to_expected_columns(tmp_path_factory, rows, concat):
    path = tmp_path_factory.mktemp("umass") / "Financial1.spc"
    t = _times(rows)
    path.write_text("".join(f"{a},{o // 512}, {s},{'w' if w else 'R'},{ti / 1e6:.6f}\n"
                            for ti, (_, w, o, s, a) in zip(t, rows)))
    cols, meta = read_trace(import_trace([path], path.with_suffix(".parquet"), "umass",
                                         {"asu": "concat" if concat else "devices"})[0])
    assert cols["ts_ns"].tolist() == ((t - t[0]) * 1000).tolist()
    assert meta["source"]["time_origin_ns"] == t[0] * 1000
    assert cols["op"].tolist() == [Op.WRITE if r[1] else Op.READ for r in rows]
    assert cols["length"].tolist() == [r[3] for r in rows]
    lba_bytes = [r[2] // 512 * 512 for r in rows]
    if concat:
        bases = {int(a): b for a, b in meta["source"]["asu_offsets"].items()}
        assert cols["offset"].tolist() == [o + bases[r[4]] for o, r in zip(lba_bytes, rows)]
        assert "device" not in cols
        ends = [o + r[3] for o, r in zip(cols["offset"].tolist(), rows)]
        assert max(ends) <= meta["device_size"]
        for a in bases:  # an ASU's I/Os stay inside its own region
            mine = [e for e, r in zip(ends, rows) if r[4] == a]
            later = [b for b in bases.values() if b > bases[a]]
            assert not later or max(mine) <= min(later)
    else:
        assert cols["offset"].tolist() == lba_bytes
        assert cols["device"].tolist() == [r[4] for r in rows]


@FAST
@given(rows=io_rows.filter(bool))
def test_fiu_rows_import_to_expected_columns(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("fiu") / "homes.blkparse"
    t = _times(rows) + 89381134073146
    path.write_text("".join(f"{ti} {4000 + a} proc{a} {o // 512} {max(1, s // 512)} {'W' if w else 'R'} 6 0 "
                            "a8c2b8ee0f9a4f6ec5f2bfee2dd4ce17\n" for ti, (_, w, o, s, a) in zip(t, rows)))
    assert sniff(path) == "fiu"
    cols, meta = read_trace(import_trace([path], path.with_suffix(".parquet"))[0])
    assert cols["ts_ns"].tolist() == (t - t[0]).tolist()
    assert cols["offset"].tolist() == [r[2] // 512 * 512 for r in rows]
    assert cols["length"].tolist() == [max(1, r[3] // 512) * 512 for r in rows]
    assert cols["pid"].tolist() == [4000 + r[4] for r in rows]
    assert cols["comm"].tolist() == [f"proc{r[4]}" for r in rows]
    assert meta["source"]["devices"] == ["6:0"]


@FAST
@given(rows=io_rows.filter(bool), pick=st.booleans())
def test_alibaba_rows_import_to_expected_columns(tmp_path_factory, rows, pick):
    tmp = tmp_path_factory.mktemp("alibaba")
    path = tmp / "io_traces.csv"
    t = _times(rows) + US_2020
    path.write_text("".join(f"{a},{'W' if w else 'R'},{o},{s},{ti}\n" for ti, (_, w, o, s, a) in zip(t, rows)))
    (tmp / "device_size.csv").write_text("".join(f"{a},{(a + 1) << 40}\n" for a in range(4)))
    device = rows[0][4] if pick else None
    cols, meta = read_trace(import_trace([path], tmp / "a.parquet", "alibaba", {"device": device})[0])
    keep = [device is None or r[4] == device for r in rows]
    kept = [r for r, k in zip(rows, keep) if k]
    assert cols["ts_ns"].tolist() == ((t[np.array(keep)] - t[0]) * 1000).tolist()
    assert cols["op"].tolist() == [Op.WRITE if r[1] else Op.READ for r in kept]
    assert cols["offset"].tolist() == [r[2] for r in kept]
    if pick:
        assert "device" not in cols and meta["device_size"] == (device + 1) << 40
    else:
        assert cols["device"].tolist() == [r[4] for r in rows]
        assert meta["source"]["device_sizes"]["3"] == 4 << 40


@FAST
@given(rows=io_rows.filter(bool))
def test_tencent_rows_spread_evenly_over_each_second(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("tencent") / "cbs.csv"
    seconds = S_2018 + _times(rows) // 1000  # several I/Os share most seconds
    path.write_text("".join(f"{s},{o // 512},{max(1, z // 512)},{int(w)},{a}\n"
                            for s, (_, w, o, z, a) in zip(seconds, rows)))
    assert sniff(path) == "tencent"
    cols, meta = read_trace(import_trace([path], path.with_suffix(".parquet"))[0])
    expected = []
    for s in seconds:
        group = np.flatnonzero(seconds == s)
        k = len([e for e in expected if e[0] == s])
        expected.append((s, (s - seconds[0]) * 10**9 + k * 10**9 // len(group)))
    assert cols["ts_ns"].tolist() == [e[1] for e in expected]
    assert cols["length"].tolist() == [max(1, r[3] // 512) * 512 for r in rows]
    assert cols["device"].tolist() == [r[4] for r in rows]
    assert meta["source"]["timing"] == "spread-within-second"
    assert "spread evenly" in meta["description"]


def test_tencent_second_split_across_blocks_is_spread_as_a_whole(tmp_path):
    from traces.formats import reading

    path = tmp_path / "cbs.csv"
    path.write_text("".join(f"{S_2018 + i // 1000},{i},8,0,1\n" for i in range(5000)))
    old = reading.BLOCK_BYTES
    reading.BLOCK_BYTES = 4096  # many blocks, seconds split across them
    try:
        cols, _ = read_trace(import_trace([path], tmp_path / "t.parquet")[0])
    finally:
        reading.BLOCK_BYTES = old
    assert cols["ts_ns"].tolist() == [(i // 1000) * 10**9 + (i % 1000) * 10**6 for i in range(5000)]


def test_several_msr_volumes_merge_by_time_into_devices(tmp_path):
    a, b = tmp_path / "hm_0.csv", tmp_path / "hm_1.csv"
    a.write_text("".join(f"{FILETIME_2007 + 10 * i},hm,0,Read,{i * 4096},4096,5\n" for i in range(0, 1000, 2)))
    b.write_text("".join(f"{FILETIME_2007 + 10 * i},hm,1,Write,{i * 4096},4096,5\n" for i in range(1, 1000, 2)))
    cols, meta = read_trace(import_trace([a, b], tmp_path / "m.parquet")[0])
    assert cols["ts_ns"].tolist() == [1000 * i for i in range(1000)]
    assert cols["device"].tolist() == [i % 2 for i in range(1000)]
    assert [v["disk"] for v in meta["source"]["volumes"]] == [0, 1]


def test_small_disorder_is_sorted_within_the_window(tmp_path):
    path = tmp_path / "fiu.txt"
    times = [0, 20, 10, 30, 25, 40]
    path.write_text("".join(f"{1000 + t} 1 p {i} 8 R 8 0 x\n" for i, t in enumerate(times)))
    cols, _ = read_trace(import_trace([path], tmp_path / "f.parquet", "fiu")[0])
    assert cols["ts_ns"].tolist() == sorted(times)
    assert cols["offset"].tolist() == [i * 512 for i in np.argsort(times, kind="stable")]


# ---------------------------------------------------------------- compressed inputs


@pytest.mark.parametrize("kind", ["gz", "xz", "zst"])
def test_compressed_inputs_are_read_directly(tmp_path, kind):
    text = "".join(f"{FILETIME_2007 + 10 * i},hm,0,Read,{i * 4096},4096,5\n" for i in range(20000)).encode()
    pack = {"gz": gzip.compress, "xz": lzma.compress,
            "zst": lambda d: zstandard.ZstdCompressor().compress(d)}[kind]
    path = tmp_path / f"hm_0.csv.{kind}"
    path.write_bytes(pack(text))
    cols, meta = read_trace(import_trace([path], tmp_path / "z.parquet")[0])
    assert len(cols["ts_ns"]) == 20000 and cols["offset"][-1] == 19999 * 4096
    assert meta["source"]["inputs"] == [path.name]


@pytest.mark.parametrize("kind", ["gz", "xz", "zst"])
def test_truncated_compressed_input_is_an_error_and_leaves_no_file(tmp_path, kind):
    text = "".join(f"{FILETIME_2007 + 10 * i},hm,0,Read,{i * 4096},4096,5\n" for i in range(50000)).encode()
    pack = {"gz": gzip.compress, "xz": lzma.compress,
            "zst": lambda d: zstandard.ZstdCompressor(write_content_size=False).compress(d)}[kind]
    data = pack(text)
    path = tmp_path / f"hm_0.csv.{kind}"
    path.write_bytes(data[: len(data) // 2])
    out = tmp_path / "z.parquet"
    with pytest.raises(TraceFormatError) as info:
        import_trace([path], out, "msr")
    assert str(path) in str(info.value)
    assert not out.exists() and list(tmp_path.iterdir()) == [path]


# ---------------------------------------------------------------- malformed input

MSR_GOOD = f"{FILETIME_2007},hm,0,Read,0,4096,5\n"

BAD_INPUTS = [
    # (format, text, line, words in the message)
    ("msr", MSR_GOOD * 3 + f"{FILETIME_2007 + 5},hm,0,Read,x12,4096,5\n", 4, "field 5"),
    ("msr", MSR_GOOD * 2 + f"{FILETIME_2007 + 5},hm,0,Read,0\n", 3, "expected 7 fields"),
    ("msr", MSR_GOOD + f"{FILETIME_2007 + 5},hm,0,Delete,0,4096,5\n", 2, "unknown operation"),
    ("msr", MSR_GOOD + f"{FILETIME_2007 + 5},hm,0,Read,0,0,5\n", 2, "greater than 0"),
    ("msr", MSR_GOOD + f"{FILETIME_2007 - 10**10},hm,0,Read,0,512,5\n", 2, "before the first record"),
    ("msr", MSR_GOOD * 2 + f"{FILETIME_2007 + 10**11},hm,0,Read,0,512,5\n" + MSR_GOOD, 4, "more than the reorder window"),
    ("msr", "1170000000,hm,0,Read,0,4096,5\n", 1, "not a Windows FILETIME"),
    ("msr", MSR_GOOD + "\xff\xfe garbage\n", 2, ""),
    ("umass", "0,1,512,r,0.1\n0,1,512,r,0.05\n", 2, "time goes back"),
    ("umass", "0,1,512,r,0.1\n0,1,512,q,0.2\n", 2, "unknown operation"),
    ("fiu", "100 1 p 0 8 R 8 0 x\n200 1 p 0 8 R 8 0\n", 2, "expected 9 fields"),
    ("alibaba", f"1,R,0,4096,{US_2020}\n1,R,0,-4096,{US_2020 + 1}\n", 2, "size"),
    ("alibaba", "1,R,0,4096,1577836800\n", 1, "not in microseconds"),
    ("tencent", f"{S_2018},0,8,0,1\n{S_2018},0,8,2,1\n", 2, "IOType 2"),
    ("tencent", f"{S_2018 * 1000},0,8,0,1\n", 1, "not in whole seconds"),
    ("tencent", f"{S_2018 + 1},0,8,0,1\n{S_2018},0,8,0,1\n", 2, "time goes back"),
    ("fio", "fio version 3 iolog\n0 f add\n0 f open\n5 f read 0 4096\n6 f write 0\n", 5, "wrong number of fields (4) for 'write'"),
    ("fio", "fio version 3 iolog\n0 f add\n5 f read 0 4096\n4 f read 0 4096\n", 4, "time goes back"),
    ("fio", "fio version 3 iolog\n0 f add\n5 f frobnicate 0 4096\n", 3, "unknown action 'frobnicate'"),
    ("fio", "fio version 3 iolog\n0 f add\n5 g read 0 4096\n", 3, "never adds"),
    ("fio", "fio version 2 iolog\nf add\nf read 0 -1\n", 3, "not a non-negative integer"),
    ("fio", "fio version 4 iolog\n", 1, "not a fio iolog"),
    ("csv", "ts_ns,op,offset,length\n0,0,0,4096\n1,9,0,4096\n", 3, "op 9"),
    ("csv", "ts_ns,op,offset,length\n0,0,0,4096\n1,1,0\n", 3, "expected 4 fields"),
    ("csv", "ts,op,offset,length\n0,0,0,4096\n", 1, "header"),
]


@pytest.mark.parametrize("fmt,text,line,words", BAD_INPUTS, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_INPUTS)])
def test_malformed_input_names_file_and_line(tmp_path, fmt, text, line, words):
    path = tmp_path / f"bad.{fmt}"
    path.write_bytes(text.encode("utf-8", "surrogateescape") if "\xff" not in text
                     else text.encode("latin-1"))
    out = tmp_path / "out.parquet"
    with pytest.raises(TraceFormatError) as info:
        import_trace([path], out, fmt)
    message = str(info.value)
    assert message.startswith(f"{path}: line {line}: "), message
    assert words in message
    assert "np." not in message  # values, not numpy's repr of them
    assert not out.exists() and list(tmp_path.iterdir()) == [path]


@FAST
@given(data=st.binary(max_size=300), fmt=st.sampled_from(["msr", "umass", "fiu", "alibaba", "tencent", "csv", "fio"]))
def test_garbage_is_a_trace_format_error_never_a_traceback(tmp_path_factory, data, fmt):
    tmp = tmp_path_factory.mktemp("garbage")
    path = tmp / "garbage.txt"
    path.write_bytes(data)
    out = tmp / "out.parquet"
    try:
        import_trace([path], out, fmt)
    except TraceFormatError as e:
        assert str(path) in str(e)
        assert not out.exists()
    assert not list(tmp.glob("*.partial"))


@FAST
@given(cut=st.integers(1, 400))
def test_truncated_text_names_its_last_line(tmp_path_factory, cut):
    tmp = tmp_path_factory.mktemp("cut")
    path = tmp / "hm_0.csv"
    full = "".join(f"{FILETIME_2007 + i},hm,0,Write,{i * 512},512,{i}\n" for i in range(20)).encode()
    path.write_bytes(full[:cut])
    lines = full[:cut].split(b"\n")
    complete = full[:cut].endswith(b"\n") or len(lines[-1].split(b",")) == 7 and lines[-1].split(b",")[6] != b""
    out = tmp / "o.parquet"
    try:
        rows = import_trace([path], out, "msr")[1]
    except TraceFormatError as e:
        assert not complete or len(lines[-1]) < len(full.split(b"\n")[len(lines) - 1])
        assert f"{path}: line {len(lines)}" in str(e) or f"{path}: line 1" in str(e)
        assert not out.exists()
    else:
        assert rows == sum(1 for line in lines if line)
