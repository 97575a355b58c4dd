"""blkparse text import: real blkparse output of real records, our blktrace export printed by the
real blkparse and read back (hypothesis), and line numbers for damaged text.
"""
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from traces.errors import TraceFormatError
from traces.formats import blkparse, blktrace, ordering
from traces.schema import Op
from traces.trace import open_trace, write_trace

from tests.traces.formats.test_blktrace import CAPTURE, CAPTURE_TEXT, read_all as read_binary, traces

needs_blkparse = pytest.mark.skipif(shutil.which("blkparse") is None, reason="needs blkparse (Debian package blktrace)")


def read_text(path, **options):
    metadata, chunks = blkparse.read([path], options)
    parts = list(chunks)
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}, metadata


def test_sniffs_blkparse_output_and_nothing_else():
    assert blkparse.sniff(CAPTURE_TEXT, CAPTURE_TEXT.read_bytes()[:65536])
    assert not blkparse.sniff(CAPTURE, CAPTURE.read_bytes()[:65536])
    assert not blkparse.sniff(Path("x.csv"), b"128166372003061629,hm,0,Read,383496192,32768,1331\n")
    assert not blktrace.sniff(CAPTURE_TEXT, CAPTURE_TEXT.read_bytes()[:65536])


@pytest.mark.parametrize("event", ["issue", "queue"])
def test_real_blkparse_output_reads_like_the_records_it_came_from(event):
    text, metadata = read_text(CAPTURE_TEXT, event=event)
    binary, _ = read_binary([CAPTURE], event=event)
    assert len(text["op"]) > 200
    for name in binary:
        if name == "ts_ns":
            # blkparse counts from its first event; the binary reader from its first record.
            assert np.array_equal(text[name] - text[name][0], binary[name] - binary[name][0])
        else:
            assert np.array_equal(text[name], binary[name]), name
    assert metadata["source"]["unmatched_ios"] == 0


ROUND_TRIP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@needs_blkparse
@ROUND_TRIP
@given(traces(), st.sampled_from(["issue", "queue"]))
def test_our_export_printed_by_blkparse_reads_back(columns, event):
    # blkparse prints no sector for a flush, so all flushes share one key: give them offset
    # 0 and, as traces() does for every key, one latency, so they pair first in, first out.
    flush = columns["op"] == Op.FLUSH
    columns["offset"][flush] = 0
    if flush.any():
        columns["latency_ns"][flush] = columns["latency_ns"][flush][0]
    with tempfile.TemporaryDirectory() as directory:
        directory = Path(directory)
        source = write_trace(directory / "t.parquet", columns, {})
        blktrace.write(open_trace(source), directory / "t.blktrace.0")
        with open(directory / "t.txt", "wb") as out:
            subprocess.run(["blkparse", "-i", str(directory / "t")], stdout=out, check=True,
                           stderr=subprocess.DEVNULL)
        back, _ = read_text(directory / "t.txt", event=event)
    assert set(back) == set(columns)
    for name, values in columns.items():
        if name == "ts_ns":
            values = values - values[0]
        assert np.array_equal(back[name], values), name


def _lines() -> list[str]:
    return CAPTURE_TEXT.read_text().splitlines(keepends=True)


@given(data=st.data())
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_line_cut_short_is_refused_with_its_number(tmp_path_factory, data):
    lines = _lines()
    events = [i for i, line in enumerate(lines) if "]" in line and line[:1] == " "]
    n = data.draw(st.sampled_from(events[:400]))
    line = lines[n]
    # A cut inside the leading blanks leaves a blank line, which is no damage.
    cut = data.draw(st.integers(len(line) - len(line.lstrip()) + 1, line.rindex("]")))
    path = tmp_path_factory.mktemp("cut") / "t.txt"
    path.write_text("".join(lines[:n]) + line[:cut])
    with pytest.raises(TraceFormatError, match=rf"line {n + 1}: "):
        read_text(path)


@given(data=st.data(), garbage=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=60))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_garbled_line_is_refused_with_its_number(tmp_path_factory, data, garbage):
    lines = _lines()
    events = [i for i, line in enumerate(lines) if line[:1] == " "]
    n = data.draw(st.sampled_from(events[:400]))
    garbage = garbage.replace("\n", " ").replace("\r", " ").replace("\x0b", " ") \
        .replace("\x0c", " ").replace("\x1c", " ").replace("\x1d", " ").replace("\x1e", " ") \
        .replace("\x85", " ").replace("\u2028", " ").replace("\u2029", " ")
    if not garbage.strip() or blkparse._SUMMARY.match(garbage):
        garbage = "x" + garbage
    path = tmp_path_factory.mktemp("garbled") / "t.txt"
    path.write_text("".join(lines[:n]) + garbage + "\n" + "".join(lines[n:]))
    try:
        read_text(path)
    except TraceFormatError as e:
        assert f"line {n + 1}: " in str(e)
    else:
        # Only a line that is itself a well-formed event may pass.
        assert blkparse._EVENT.match(garbage.encode())


def test_summary_and_blank_lines_are_ignored(tmp_path):
    lines = [line for line in _lines() if blkparse._EVENT.match(line.encode())]
    plain = tmp_path / "plain.txt"
    plain.write_text("".join(lines))
    noisy = tmp_path / "noisy.txt"
    noisy.write_text("\n".join(lines[:50]) + "\n" + "".join(lines[50:])
                     + "CPU0 (7,0):\n Reads Queued: 1, 4KiB\nTotal (7,0):\nanything at all\n")
    a, _ = read_text(plain)
    b, _ = read_text(noisy)
    for name in a:
        assert np.array_equal(a[name], b[name]), name


def test_several_files_are_refused(tmp_path):
    with pytest.raises(TraceFormatError, match="one file"):
        blkparse.read([CAPTURE_TEXT, CAPTURE_TEXT], {})


# One request (4096) whose I and D events carry the same damaged time, between two good ones.
DAMAGED_REQUEST = """\
  8,0    0        1     0.000000000  1234  Q   R 2048 + 8 [fio]
  8,0    0        2     0.000005000  1234  D   R 2048 + 8 [fio]
  8,0    0        3     0.000400000     0  C   R 2048 + 8 [0]
  8,0    0        4     0.001000000  1234  Q   R 4096 + 8 [fio]
  8,0    0        5     0.001001000  1234  G   R 4096 + 8 [fio]
  8,0    0        6 1270000000.001002000  1234  I   R 4096 + 8 [fio]
  8,0    0        7 1270000000.001005000  1234  D   R 4096 + 8 [fio]
  8,0    0        8     0.001400000     0  C   R 4096 + 8 [0]
  8,0    0        9     0.002000000  1234  Q   R 8192 + 8 [fio]
  8,0    0       10     0.002005000  1234  D   R 8192 + 8 [fio]
  8,0    0       11     0.002400000     0  C   R 8192 + 8 [0]
"""


def test_a_request_whose_i_and_d_times_are_damaged_is_an_outlier_named_by_its_line(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(DAMAGED_REQUEST)
    with pytest.raises(TraceFormatError, match=r"line 6: this record's time is 40.2 years away"):
        read_text(path)
    outliers = ordering.OutlierLog(drop=True)
    cols, metadata = read_text(path, outliers=outliers)
    assert cols["offset"].tolist() == [2048 * 512, 8192 * 512]
    assert cols["latency_ns"].tolist() == [395_000, 395_000]
    assert outliers.dropped == ["t.txt:6", "t.txt:7"]
    assert metadata["source"]["unmatched_completions"] == 1


def test_a_run_of_damaged_times_longer_than_a_request_is_no_outlier(tmp_path):
    """Five records in a row far away are not taken for damage: the import stops."""
    lines = DAMAGED_REQUEST.splitlines(keepends=True)
    lines[4] = lines[4].replace("    0.001001000", "1270000000.001001000")
    lines[3] = lines[3].replace("    0.001000000", "1270000000.001000000")
    lines[7] = lines[7].replace("    0.001400000", "1270000000.001400000")
    path = tmp_path / "t.txt"
    path.write_text("".join(lines))
    with pytest.raises(TraceFormatError, match=r"line 9: time goes back"):
        read_text(path, outliers=ordering.OutlierLog(drop=True))


# Q 1000+8 starts a request; Q 1008+8 back-merges (M) into it, Q 992+8 front-merges (F);
# the request is issued and completed as 992+24.
MERGES = [  # (time ns, action letter, sector, sectors)
    (0, "Q", 1000, 8), (1_000, "G", 1000, 8), (2_000, "Q", 1008, 8), (3_000, "M", 1008, 8),
    (4_000, "Q", 992, 8), (5_000, "F", 992, 8), (10_000, "D", 992, 24), (100_000, "C", 992, 24),
]


def _merge_records() -> bytes:
    codes = {"Q": (1, blktrace.TC_QUEUE), "G": (4, 0), "M": (2, 0), "F": (3, 0),
             "D": (7, blktrace.TC_ISSUE), "C": (8, blktrace.TC_COMPLETE)}
    records = np.zeros(len(MERGES), blktrace.RECORD_LE)
    for record, (time, letter, sector, sectors) in zip(records, MERGES):
        code, stage = codes[letter]
        record["magic"] = blktrace.MAGIC | blktrace.VERSION
        record["time"], record["sector"], record["bytes"] = time, sector, sectors * 512
        record["action"] = ((blktrace.TC_WRITE | stage) << 16) | code
        record["pid"], record["device"] = 100, blktrace.dev_t(8, 0)
    return records.tobytes()


def _check_merged(cols, metadata):
    assert cols["offset"].tolist() == [1000 * 512, 1008 * 512, 992 * 512]
    assert cols["latency_ns"].tolist() == [100_000, 98_000, 96_000]
    assert metadata["source"]["unmatched_ios"] == 0
    assert metadata["source"]["unmatched_completions"] == 0


def test_queued_bios_merged_into_a_request_complete_with_it(tmp_path):
    path = tmp_path / "m.blktrace.0"
    path.write_bytes(_merge_records())
    _check_merged(*read_binary([path], event="queue"))
    cols, metadata = read_binary([path], event="issue")
    assert (cols["offset"].tolist(), cols["length"].tolist(), cols["latency_ns"].tolist()) == \
        ([992 * 512], [24 * 512], [90_000])


@needs_blkparse
def test_queued_bios_merged_into_a_request_complete_with_it_in_blkparse_text(tmp_path):
    (tmp_path / "m.blktrace.0").write_bytes(_merge_records())
    with open(tmp_path / "m.txt", "wb") as out:
        subprocess.run(["blkparse", "-i", str(tmp_path / "m")], stdout=out, check=True,
                       stderr=subprocess.DEVNULL)
    assert [line.split()[5] for line in (tmp_path / "m.txt").read_text().splitlines()[:8]] == \
        [letter for _, letter, _, _ in MERGES]
    _check_merged(*read_text(tmp_path / "m.txt", event="queue"))


def test_the_refusal_of_a_missing_event_names_every_event_the_trace_has(tmp_path):
    path = tmp_path / "idc.txt"
    path.write_text("  8,0 0 1 0.000000000 7 I R 2048 + 8 [fio]\n  8,0 0 2 0.000005000 7 D R 2048 + 8 [fio]\n"
                    "  8,0 0 3 0.000400000 0 C R 2048 + 8 [0]\n")
    with pytest.raises(TraceFormatError, match="no Q events; this trace has I/D/C only: use --event issue"):
        read_text(path, event="queue")


def test_notes_are_no_events_when_a_missing_event_is_refused(tmp_path):
    """An export starts with a clock note, action code 1 like Q: it is not taken for a Q."""
    records = np.frombuffer(_merge_records(), blktrace.RECORD_LE)
    path = tmp_path / "dc.blktrace.0"
    path.write_bytes(blktrace._note(0, 0, blktrace.TN_TIMESTAMP, bytes(8), blktrace.dev_t(8, 0))
                     + records[-2:].tobytes())
    with pytest.raises(TraceFormatError, match="no Q events; this trace has D/C only: use --event issue"):
        read_binary([path], event="queue")
