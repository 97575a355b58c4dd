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
