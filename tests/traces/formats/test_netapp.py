"""NetApp controller CSV in hfplayer's layout: its sample's header (bin/sampleTrace.csv of
umn-cris/hfplayer) with rows written here, sniffing against every other format, errors
naming the line, and generated files imported column by column."""
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli_process import replay_cli
from traces import formats
from traces.convert import import_trace, sniff
from traces.errors import TraceFormatError
from traces.formats.inputs import read_head
from traces.schema import Op
from traces.trace import read_trace

DATA = Path(__file__).resolve().parents[2] / "data"
HEADER = ("#DUMP_OFFSET.I,ELAPSED_USECS.D,ELAPSED_TICKS.I,CMD.S,INFLIGHT_IOS.I,TS.I,SEQID.I,LUN_SSID.I,"
          "OP.I,PHASE.I,LBA.I,NBLKS.I,LATENCY_TICKS.I,HOST_ID.I,HOST_LUN.I,LATENCY_USECS.D")


def row(usecs, lun, op, lba, nblks, latency, cmd="RD"):
    """One record in hfplayer's sample layout; the columns we do not read get plausible values."""
    return f"4124,{usecs},822590674,{cmd},2,822590674,5001,{lun},{op},0,{lba},{nblks},426600,7,6,{latency}"


def write(path, rows, header=HEADER):
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def imported(tmp_path, path, *fmt):
    out, _ = import_trace([path], tmp_path / "out.parquet", *fmt)
    cols, meta = read_trace(out)
    return {k: v.tolist() for k, v in cols.items()}, meta


def test_hfplayer_sample_layout(tmp_path):
    path = write(tmp_path / "sampleTrace.csv", [
        row(50, 6, 0, 2, 2, 200), row(100.5, 6, 1, 4, 8, 200.25, "WR"),
        row(150, 6, 7, 6, 2, 200, "XX"), row(140, 9, 0, 8, 16, 12.5)])
    assert sniff(path) == "netapp"
    cols, meta = imported(tmp_path, path)
    # The record logged at 150 us comes before the one at 140 us: sorted; op 7 is left out.
    assert cols["ts_ns"] == [0, 50_500, 90_000]
    assert cols["op"] == [Op.READ, Op.WRITE, Op.READ]
    assert cols["offset"] == [2 * 512, 4 * 512, 8 * 512]
    assert cols["length"] == [2 * 512, 8 * 512, 16 * 512]
    assert cols["latency_ns"] == [200_000, 200_250, 12_500]
    assert cols["device"] == [6, 6, 9]
    assert meta["source"]["skipped_ops"] == {"7": 1}
    assert meta["source"]["time_origin_ns"] == 50_000


def test_columns_by_name_in_any_order_and_case_without_the_hash(tmp_path):
    path = write(tmp_path / "t.csv", ["3,5,7,10.25,0", "1,2,3,11,1"], "nblks.i,LBA.I,extra.S,Elapsed_Usecs.D,op.i")
    assert sniff(path) == "netapp"
    cols, meta = imported(tmp_path, path)
    assert cols["ts_ns"] == [0, 750]
    assert cols["op"] == [Op.READ, Op.WRITE]
    assert cols["offset"] == [5 * 512, 2 * 512] and cols["length"] == [3 * 512, 512]
    assert "latency_ns" not in cols and "device" not in cols
    assert meta["source"]["time_origin_ns"] == 10_250


def test_the_sample_is_netapp_and_nothing_else(tmp_path):
    path = write(tmp_path / "sampleTrace.csv", [row(50 * i, 6, i % 2, 2 * i, 2, 200) for i in range(1, 40)])
    head = read_head(path)
    assert [n for n in formats.NAMES if formats.get(n).sniff(path, head)] == ["netapp"]


@pytest.mark.parametrize("path", sorted(p for p in [*(DATA / "wild").iterdir(), *DATA.glob("blk-*")]),
                         ids=lambda p: p.name)
def test_netapp_claims_no_other_formats_file(path):
    from traces.formats import netapp

    assert not netapp.sniff(path, read_head(path))


def test_tracereplay_csv_is_not_netapp(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("ts_ns,op,offset,length\n0,0,0,4096\n")
    assert sniff(path) == "csv"


@pytest.mark.parametrize("line,words", [
    ("4124,50,1,RD,2,3,5001,6,0,0,2", "expected 16 fields"),
    ("4124,abc,1,RD,2,3,5001,6,0,0,2,2,426600,7,6,200", "field 2 is 'abc', expected a number"),
    ("4124,50,1,RD,2,3,5001,6,0,0,4k,2,426600,7,6,200", "field 11 is '4k', expected an integer"),
    (row(-5, 6, 0, 2, 2, 200), "ELAPSED_USECS must be a number >= 0"),
    (row("nan", 6, 0, 2, 2, 200), "ELAPSED_USECS must be a number >= 0"),
    (row(60, 6, 0, -2, 2, 200), "LBA must be from 0"),
    (row(60, 6, 0, 2, 0, 200), "NBLKS must be from 1"),
    (row(60, 6, 0, 2, 2**60, 200), "NBLKS must be from 1"),
    (row(60, 6, 0, 2, 2, -1), "LATENCY_USECS must be a number >= 0"),
    (row(60, -6, 0, 2, 2, 1), "LUN_SSID must be from 0"),
])
def test_a_bad_line_is_named(tmp_path, line, words):
    path = write(tmp_path / "bad.csv", [row(50, 6, 0, 2, 2, 200), line, row(70, 6, 0, 2, 2, 200)])
    with pytest.raises(TraceFormatError, match=f"{path}: line 3: {words}"):
        import_trace([path], tmp_path / "out.parquet", "netapp")
    assert not (tmp_path / "out.parquet").exists()


def test_a_missing_column_is_named_at_line_1(tmp_path):
    path = write(tmp_path / "t.csv", ["1,2,3"], "#ELAPSED_USECS.D,OP.I,LBA.I")
    with pytest.raises(TraceFormatError, match="line 1: the header must name the columns, including ELAPSED_USECS"):
        import_trace([path], tmp_path / "out.parquet", "netapp")


def test_cli_garbage_is_one_error_line(tmp_path):
    path = write(tmp_path / "bad.csv", [row(50, 6, 0, 2, 2, 200), "garbage here"])
    out = tmp_path / "out.parquet"
    done = replay_cli("import", path, "-o", out, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [f"error: {path}: line 3: expected 16 fields separated by ',', found 1"]
    assert not out.exists()


def test_a_file_of_only_skipped_ops_has_nothing_to_import(tmp_path):
    path = write(tmp_path / "t.csv", [row(50, 6, 2, 2, 2, 200), row(60, 6, 3, 2, 2, 200)])
    with pytest.raises(TraceFormatError, match="no I/O records"):
        import_trace([path], tmp_path / "out.parquet", "netapp")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.lists(st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=["Cs"]), max_size=60),
                        min_size=1, max_size=5))
def test_garbage_after_the_header_is_an_error_naming_a_line(tmp_path_factory, garbage):
    tmp = tmp_path_factory.mktemp("garbage")
    path = write(tmp / "g.csv", [row(50, 6, 0, 2, 2, 200), *garbage])
    try:
        import_trace([path], tmp / "out.parquet", "netapp")
    except TraceFormatError as e:
        assert f"{path}: line " in str(e) and len(str(e).splitlines()) == 1
        assert not (tmp / "out.parquet").exists()


RECORDS = st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 2**40), st.integers(1, 2**16),
                             st.sampled_from([0, 1, 2]), st.integers(0, 10**7), st.integers(0, 2**32 - 1)),
                   min_size=1, max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=RECORDS, shuffle=st.randoms(use_true_random=False))
def test_generated_files_import_as_written(tmp_path_factory, records, shuffle):
    tmp = tmp_path_factory.mktemp("netapp")
    # Times in ns written as decimal microseconds; the columns in a shuffled order.
    times = np.cumsum([r[0] for r in records])
    names = ["ELAPSED_USECS.D", "OP.I", "LBA.I", "NBLKS.I", "LATENCY_USECS.D", "LUN_SSID.I", "CMD.S"]
    order = list(range(len(names)))
    shuffle.shuffle(order)
    lines = []
    for t, (_, lba, nblks, op, latency, lun) in zip(times.tolist(), records):
        values = [f"{t // 1000}.{t % 1000:03d}", op, lba, nblks, f"{latency // 1000}.{latency % 1000:03d}", lun, "X"]
        lines.append(",".join(str(values[i]) for i in order))
    path = write(tmp / "gen.csv", lines, "#" + ",".join(names[i] for i in order))
    kept = [(t, r) for t, r in zip(times.tolist(), records) if r[3] in (0, 1)]
    if not kept:
        with pytest.raises(TraceFormatError, match="no I/O records"):
            import_trace([path], tmp / "out.parquet", "netapp")
        return
    cols, meta = imported(tmp, path, "netapp")
    assert meta["source"]["time_origin_ns"] == kept[0][0]
    assert cols["ts_ns"] == [t - kept[0][0] for t, _ in kept]
    assert cols["op"] == [Op.WRITE if r[3] == 1 else Op.READ for _, r in kept]
    assert cols["offset"] == [r[1] * 512 for _, r in kept]
    assert cols["length"] == [r[2] * 512 for _, r in kept]
    assert cols["latency_ns"] == [r[4] for _, r in kept]
    assert cols["device"] == [r[5] for _, r in kept]
    assert sum(meta["source"]["skipped_ops"].values()) == len(records) - len(kept)
