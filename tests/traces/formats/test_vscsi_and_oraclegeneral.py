"""The binary formats libCacheSim reads: vscsi (CloudPhysics) and oracleGeneral. Records are
packed here field by field with `struct`, in the C layouts of libCacheSim's readers (vscsi.h,
oracleGeneralBin.h), not with the importers' own dtypes; where the libcachesim package is
installed, its own reader reads our export."""
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traces.convert import export_trace, import_trace, sniff
from traces.errors import TraceFormatError
from traces.formats import oraclegeneral
from traces.schema import Op
from traces.trace import read_trace, write_trace

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
READ10, WRITE10, INQUIRY, SYNC10 = 0x28, 0x2A, 0x12, 0x35


def vscsi1(sn, length, cmd, lbn, ts):
    return struct.pack("<IIIHHQQ", sn, length, 1, cmd, 0x100, lbn, ts)


def vscsi2(sn, length, cmd, lbn, ts, rt):
    return struct.pack("<HHIIIQQQ", cmd, 0x200, sn, length, 1, lbn, ts, rt)


def oracle(time, obj, size, nxt):
    return struct.pack("<IQIq", time, obj, size, nxt)


def _import(tmp_path, data, name, fmt=None):
    path = tmp_path / name
    path.write_bytes(data)
    out, _ = import_trace([path], tmp_path / f"{name}.parquet", fmt)
    return read_trace(out)


def test_vscsi1_as_the_cloudphysics_traces_hold_it(tmp_path):
    """The first record of a real CloudPhysics trace (sn 2147483892, a 512-byte WRITE(10) at lbn
    42932745, ts 5633898368802 us), then a read, an INQUIRY (no data: left out) and a flush."""
    data = (vscsi1(2147483892, 512, WRITE10, 42932745, 5633898368802)
            + vscsi1(2147483893, 4096, READ10, 100, 5633898368902)
            + vscsi1(2147483894, 36, INQUIRY, 0, 5633898368903)
            + vscsi1(2147483895, 0, SYNC10, 0, 5633898369002))
    assert sniff_bytes(tmp_path, data) == "vscsi"
    cols, meta = _import(tmp_path, data, "w01.vscsi")
    assert cols["ts_ns"].tolist() == [0, 100_000, 200_000]
    assert cols["op"].tolist() == [Op.WRITE, Op.READ, Op.FLUSH]
    assert cols["offset"].tolist() == [42932745 * 512, 100 * 512, 0]
    assert cols["length"].tolist() == [512, 4096, 0]
    assert meta["source"]["versions"] == [1] and meta["source"]["skipped_commands"] == {"0x12": 1}
    assert meta["source"]["time_origin_ns"] == 5633898368802 * 1000


def test_vscsi2_carries_a_response_time(tmp_path):
    data = vscsi2(1, 8192, READ10, 8, 1000, 250) + vscsi2(2, 4096, WRITE10, 64, 1500, 90)
    assert sniff_bytes(tmp_path, data) == "vscsi"
    cols, meta = _import(tmp_path, data, "w02.vscsi")
    assert cols["ts_ns"].tolist() == [0, 500_000]
    assert cols["latency_ns"].tolist() == [250_000, 90_000]
    assert meta["source"]["versions"] == [2]


@pytest.mark.parametrize("data,words", [
    (vscsi1(1, 512, READ10, 8, 100) + vscsi1(2, 512, READ10, 8, 200)[:20], "byte offset 32: the file ends 20 bytes into a 32-byte record"),
    (vscsi1(1, 512, READ10, 8, 100) + vscsi1(2, 0, READ10, 8, 200), "record 1 (byte offset 32): a read or write of 0 bytes"),
    (vscsi1(1, 512, READ10, 8, 5_000_000) + vscsi1(2, 512, READ10, 8, 100), "record 1 (byte offset 32): time before"),
    (vscsi1(1, 512, READ10, 8, 5_000_000) + vscsi1(2, 512, READ10, 8, 8_000_000) + vscsi1(3, 512, READ10, 8, 5_000_001),
     "record 2: time goes back by 2.999999 s, more than the reorder window"),
    (b"time,lba\n" * 10, "not a vscsi trace"),
])
def test_damaged_vscsi_is_refused_naming_the_record(tmp_path, data, words):
    path = tmp_path / "bad.vscsi"
    path.write_bytes(data)
    with pytest.raises(TraceFormatError) as info:
        import_trace([path], tmp_path / "o.parquet", "vscsi")
    assert str(info.value).startswith(f"{path}: ") and words in str(info.value)
    assert not (tmp_path / "o.parquet").exists()


def test_oraclegeneral_as_libcachesim_writes_it(tmp_path):
    """traceConv's records: next_access_vtime is the 1-based number of the next request for the
    object, -1 for none; times in whole seconds, spread over their second on import."""
    data = (oracle(100, 8, 4096, 3) + oracle(100, 16, 8192, -1) + oracle(101, 8, 4096, -1)
            + oracle(101, 24, 512, -1) + oracle(101, 32, 512, -1))
    assert sniff_bytes(tmp_path, data) == "oraclegeneral"
    cols, meta = _import(tmp_path, data, "t.oracleGeneral")
    assert cols["ts_ns"].tolist() == [0, 500_000_000, 1_000_000_000, 1_333_333_333, 1_666_666_666]
    assert cols["offset"].tolist() == [8 * 512, 16 * 512, 8 * 512, 24 * 512, 32 * 512]
    assert cols["length"].tolist() == [4096, 8192, 4096, 512, 512]
    assert set(cols["op"].tolist()) == {Op.READ}
    assert meta["source"]["time_origin_ns"] == 100 * 10**9


def test_next_access_matches_a_plain_reference():
    rng = np.random.default_rng(3)
    obj = rng.integers(0, 50, 2000).astype(np.uint64)
    expected, seen = [-1] * len(obj), {}
    for i in range(len(obj) - 1, -1, -1):
        expected[i] = seen.get(int(obj[i]), -1)
        seen[int(obj[i])] = i + 1
    assert oraclegeneral.next_access(obj).tolist() == expected


traces = st.lists(st.tuples(st.integers(0, 3 * 10**9), st.sampled_from([Op.READ, Op.WRITE, Op.FLUSH]),
                            st.integers(0, 2**30), st.integers(1, 2**20)), min_size=1, max_size=40)


@FAST
@given(rows=traces)
def test_oraclegeneral_export_then_import_keeps_blocks_sizes_and_seconds(tmp_path_factory, rows):
    tmp = tmp_path_factory.mktemp("og")
    ts = np.cumsum([r[0] for r in rows]).astype(np.int64)
    op = np.array([r[1] for r in rows], np.uint8)
    cols = {"ts_ns": ts, "op": op, "offset": np.array([r[2] * 512 for r in rows], np.int64),
            "length": np.where(op == Op.FLUSH, 0, [r[3] for r in rows]).astype(np.int64)}
    out = export_trace(write_trace(tmp / "a.parquet", cols, {}), "oraclegeneral", tmp / "a.oracleGeneral")
    data = op != Op.FLUSH
    raw = np.frombuffer(out.read_bytes(), oraclegeneral.RECORD)
    assert raw["time"].tolist() == (ts[data] // 10**9).tolist()
    assert raw["next"].tolist() == oraclegeneral.next_access(raw["obj_id"]).tolist()
    if not data.any():
        return
    back, meta = read_trace(import_trace([out], tmp / "b.parquet")[0])
    assert back["offset"].tolist() == cols["offset"][data].tolist()
    assert back["length"].tolist() == cols["length"][data].tolist()
    seconds = (back["ts_ns"] + meta["source"]["time_origin_ns"]) // 10**9
    assert seconds.tolist() == (ts[data] // 10**9).tolist()


@FAST
@given(data=st.binary(min_size=1, max_size=400), fmt=st.sampled_from(["vscsi", "oraclegeneral"]))
def test_garbage_is_a_clear_error_never_a_traceback(tmp_path_factory, data, fmt):
    tmp = tmp_path_factory.mktemp("garbage")
    path = tmp / "g.bin"
    path.write_bytes(data)
    try:
        import_trace([path], tmp / "o.parquet", fmt)
    except TraceFormatError as e:
        assert str(path) in str(e) and "np." not in str(e)
        assert not (tmp / "o.parquet").exists()


def sniff_bytes(tmp_path, data):
    path = tmp_path / "sniffed"
    path.write_bytes(data)
    return sniff(path)


def test_libcachesim_reads_our_export(tmp_path):
    """libCacheSim's own reader (the libcachesim package, where installed) reads the export."""
    lcs = pytest.importorskip("libcachesim")
    cols = {"ts_ns": np.array([0, 10**9, 2 * 10**9 + 5], np.int64), "op": np.array([Op.READ, Op.WRITE, Op.READ], np.uint8),
            "offset": np.array([4096, 8192, 4096], np.int64), "length": np.array([4096, 512, 4096], np.int64)}
    out = export_trace(write_trace(tmp_path / "a.parquet", cols, {}), "oraclegeneral", tmp_path / "a.oracleGeneral")
    got = [(r.clock_time, r.obj_id, r.obj_size, r.next_access_vtime)
           for r in lcs.TraceReader(str(out), lcs.TraceType.ORACLE_GENERAL_TRACE)]
    never = np.iinfo(np.int64).max  # libCacheSim reads -1 as "no reuse"
    assert got == [(0, 8, 4096, 3), (1, 16, 512, never), (2, 8, 4096, never)]
