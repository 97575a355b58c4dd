"""Options at the edge of their range (0, -1, nan, inf, 1e308, huge integers) are refused in
one line with exit 2 before anything is written, or run correctly; never a traceback, never a
wrapped clock."""
import os

import numpy as np
import pytest

from tests.cli_process import refused, replay_cli
from traces.schema import MAX_IO_BYTES, Op
from traces.trace import write_trace


@pytest.mark.parametrize("scale", ["1e308", "1e12", "inf", "nan", "-1"])
def test_a_think_scale_out_of_range_is_refused_before_anything_is_written(tmp_path, scale):
    # 1e308 once wrapped the engine's due times negative: every I/O went at once, then a
    # traceback left a 4-row results file.
    done = replay_cli("run", "filecopy", "--engine", "null", "--timing", "causal", "--think-scale", scale,
                      "-o", tmp_path / "out.parquet", cwd=tmp_path)
    refused(done, "--think-scale")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("scale", ["0", "0.5"])
def test_a_think_scale_in_range_runs(tmp_path, scale):
    done = replay_cli("run", "filecopy", "--engine", "null", "--timing", "causal", "--think-scale", scale,
                      "-o", tmp_path / "out.parquet")
    assert done.returncode == 0, done.stderr


def _image(path, size=16 << 20):
    path.write_bytes(b"\x5a" * size)
    return path


@pytest.mark.parametrize("args, words", [
    (["mix", "--qd", "1x99999"], "1x99999"),
    (["steady", "--qd-scaling", "99999"], "--qd-scaling"),
    (["pts", "--block-sizes", "4K,0"], "--block-sizes"),
    (["mix", "--read-shares", "50.5"], "whole percent"),
], ids=["qd", "qd-scaling", "block-sizes", "read-shares"])
def test_bench_options_the_runs_would_refuse_are_refused_before_the_fill(tmp_path, args, words):
    # Each was refused only once the fill had written the whole target (or, 50.5, run as 50).
    target = _image(tmp_path / "t.img")
    done = replay_cli("bench", args[0], target, "-o", tmp_path / "out", "--span", "8M",
                      "--engine", "psync", *args[1:])
    refused(done, words)
    assert target.read_bytes() == b"\x5a" * (16 << 20) and not (tmp_path / "out").exists()


def test_bench_refuses_a_target_inside_its_results_directory(tmp_path):
    (tmp_path / "out").mkdir()
    target = _image(tmp_path / "out" / "t.img")
    done = replay_cli("bench", "mix", target, "-o", tmp_path / "out", "--span", "8M", "--engine", "psync")
    refused(done, "is inside the results directory")
    assert target.read_bytes() == b"\x5a" * (16 << 20)


def test_an_io_longer_than_one_read_moves_is_refused_even_in_a_dry_run(tmp_path):
    # --dry-run said such a trace checked out; the run then ended in the engine's traceback.
    write_trace(tmp_path / "big.parquet", {
        "ts_ns": np.array([0, 1000], np.int64), "op": np.array([Op.READ, Op.READ], np.uint8),
        "offset": np.array([0, 0], np.int64), "length": np.array([4096, MAX_IO_BYTES + 4096], np.int64)},
        {"name": "big", "device_size": 4 << 30})
    target = tmp_path / "t.img"
    target.touch()
    os.truncate(target, 4 << 30)
    for args in (["--dry-run"], ["--afap", "--engine", "psync"]):
        done = replay_cli("run", tmp_path / "big.parquet", target, "-o", tmp_path / "out.parquet", *args)
        assert refused(done) == ("error: the trace has an I/O of 2,147,483,648 bytes; one read or write "
                                 "moves at most 2,147,479,552 (2 GiB - 4 KiB) on Linux: split it into "
                                 "shorter I/Os")
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize("command", [["run", "demo", "--engine", "null", "--dry-run"],
                                     ["bench", "mix", "--engine", "null"]], ids=["run", "bench"])
def test_unicode_digits_in_data_are_refused(tmp_path, command):
    # int("５") is 5, so the check passed; the engine, handed the text, raised a traceback.
    done = replay_cli(*command, "-o", tmp_path / "out", "--data", "compressible:５", cwd=tmp_path)
    refused(done, "--data", "compressible:５")
    assert os.listdir(tmp_path) == []


def test_bench_refuses_an_output_that_is_a_file(tmp_path):
    (tmp_path / "results").write_text("kept")
    target = _image(tmp_path / "t.img")
    done = replay_cli("bench", "mix", target, "-o", tmp_path / "results", "--span", "8M",
                      "--engine", "psync")
    refused(done, "is not a directory")
    assert (tmp_path / "results").read_text() == "kept" and target.read_bytes() == b"\x5a" * (16 << 20)


@pytest.mark.parametrize("option, value, message", [
    ("--multiple", "1e308", "--multiple must be above 0 and at most 100,000, not 1e+308"),
    ("--start", "0", "--start must be a whole multiple from 1 to 100,000, not 0"),
    ("--step", "-1", "--step must be a whole multiple from 1 to 100,000, not -1"),
    ("--duration", "inf", "--duration must be a number of seconds above 0 and at most 31,536,000 (a year), not inf"),
    ("--period", "1e308", "--period must be a number of seconds above 0 and at most 31,536,000 (a year), not 1e+308"),
    ("--scale", "1e308", "--scale must be above 0 and at most 1460 (a year of the longest test), not 1e+308"),
    ("--max-rounds", str(2**64), f"--max-rounds must be from 1 to 1000, not {2**64}"),
    ("--seed", "-1", "--seed must be 0 or more, not -1"),
])
def test_bench_numbers_out_of_range_are_one_line_before_the_fill(tmp_path, option, value, message):
    target = _image(tmp_path / "t.img")
    done = replay_cli("bench", "act", target, "-o", tmp_path / "out", "--span", "8M", "--engine", "psync",
                      option, value)
    assert refused(done) == f"error: {message}"
    assert target.read_bytes() == b"\x5a" * (16 << 20) and not (tmp_path / "out").exists()
