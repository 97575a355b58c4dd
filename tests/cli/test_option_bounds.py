"""Options at the edge of their range (0, -1, nan, inf, 1e308, huge integers) are refused in
one line with exit 2 before anything is written, or run correctly; never a traceback, never a
wrapped clock."""
import os

import pytest

from tests.cli_process import refused, replay_cli


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
