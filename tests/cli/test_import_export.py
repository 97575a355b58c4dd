"""`replay import` and `replay export` as a user meets them, in a real process: help, a
successful import and export, and bad input as one error line, exit code 2 and no output.
"""
import gzip

import numpy as np
import pytest

from tests.cli_process import replay_cli
from traces.schema import Op
from traces.trace import read_trace, write_trace

FILETIME_2007 = 128166372000000000
IMPORT_FLAGS = ["-o", "--output", "--format", "--event", "--asu", "--device", "--time-unit", "--drop-outliers", "--name"]
EXPORT_FLAGS = ["-o", "--output", "--format"]


@pytest.mark.parametrize("command,flags", [("import", IMPORT_FLAGS), ("export", EXPORT_FLAGS)])
def test_help_names_every_option_and_an_example(command, flags):
    done = replay_cli(command, "--help")
    assert done.returncode == 0, done.stderr
    for flag in flags:
        assert f" {flag}" in done.stdout, f"{flag} is missing from `replay {command} --help`"
    assert f"Example: replay {command}" in done.stdout


def test_import_options_are_in_the_docs():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    for flag in IMPORT_FLAGS + EXPORT_FLAGS:
        assert flag in page, flag


def test_import_gz_then_export_csv_and_fio(tmp_path):
    src = tmp_path / "hm_0.csv.gz"
    src.write_bytes(gzip.compress("".join(
        f"{FILETIME_2007 + 100 * i},hm,0,{'Read' if i % 3 else 'Write'},{i * 4096},4096,{i}\n"
        for i in range(1000)).encode()))
    out = tmp_path / "hm.parquet"
    done = replay_cli("import", src, "-o", out, "--name", "hm0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "imported 1000 I/Os" in done.stdout
    cols, meta = read_trace(out)
    assert cols["ts_ns"].tolist() == [10_000 * i for i in range(1000)]
    assert meta["name"] == "hm0"
    assert meta["source"]["kind"] == "import:msr"
    assert meta["source"]["command"].startswith("replay import ") and "hm0" in meta["source"]["command"]
    assert meta["source"]["inputs"] == ["hm_0.csv.gz"]

    csv_out, fio_out = tmp_path / "hm.csv", tmp_path / "hm.iolog"
    done = replay_cli("export", out, "--format", "csv", "-o", csv_out)
    assert done.returncode == 0, done.stderr
    lines = csv_out.read_text().splitlines()
    assert lines[0].replace('"', "") == "ts_ns,op,offset,length,latency_ns"
    assert lines[2] == f"10000,0,4096,4096,100"
    done = replay_cli("export", out, "--format", "fio", "-o", fio_out)
    assert done.returncode == 0, done.stderr
    io_lines = [line for line in fio_out.read_text().splitlines() if len(line.split()) == 5]
    assert len(io_lines) == 1000 and io_lines[1] == "10 tracereplay.img read 4096 4096"


def _msr_bad_line(tmp_path):
    bad = tmp_path / "hm_0.csv"
    bad.write_text(f"{FILETIME_2007},hm,0,Read,0,4096,5\n{FILETIME_2007 + 1},hm,0,Read,0,abc,5\n")
    return ["import", bad], f"{bad}: line 2: field 6 is 'abc'"


def _unknown_format(tmp_path):
    odd = tmp_path / "odd.txt"
    odd.write_text("hello world\n")
    return ["import", odd], "cannot tell the trace format; name it with --format"


def _missing_input(tmp_path):
    return ["import", tmp_path / "nope.csv"], "nope.csv: no such file"


def _bad_device(tmp_path):
    trace = tmp_path / "io.csv"
    trace.write_text("1,R,0,4096,1577836800000000\n")
    return ["import", trace, "--format", "alibaba", "--device", "x"], "--device must be a device_id number"


def _export_missing_trace(tmp_path):
    return ["export", tmp_path / "none" / "t.parquet", "--format", "csv"], "no such trace file"


@pytest.mark.parametrize("case", [_msr_bad_line, _unknown_format, _missing_input, _bad_device,
                                  _export_missing_trace])
def test_bad_input_is_one_error_line_exit_2_and_no_output(tmp_path, case):
    args, expected = case(tmp_path)
    out = tmp_path / "out.parquet"
    done = replay_cli(*args, "-o", out, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    assert expected in errors[0], errors[0]
    assert not out.exists()
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob(".*.partial"))


def test_export_blktrace_works_or_says_clearly_that_it_cannot(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", {
        "ts_ns": np.array([0, 1000]), "op": np.array([Op.READ, Op.WRITE], np.uint8),
        "offset": np.array([0, 4096]), "length": np.array([4096, 4096])}, {})
    out = tmp_path / "t.blktrace"
    done = replay_cli("export", trace, "--format", "blktrace", "-o", out)
    assert "Traceback" not in done.stderr
    if done.returncode == 0:
        assert out.stat().st_size > 0
    else:
        assert done.returncode == 2
        assert done.stderr.startswith("error: export to blktrace is not available"), done.stderr
        assert not out.exists()


def test_the_export_formats_are_the_formats_whose_module_writes():
    from traces import formats

    assert set(formats.WRITERS) == {name for name in formats.NAMES if hasattr(formats.get(name), "write")}
