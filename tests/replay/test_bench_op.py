"""`replay bench --op PERCENT`, over-provisioning: the whole target discarded first, as the
block layer's own discard counters show on a loop device, then every I/O of the test, its
fill's included, inside the first (100 - PERCENT) %; and bad values refused before a write.
"""
import json
import os
from pathlib import Path

import numpy as np
import pytest

from replay.bench.options import BenchError, BenchOptions
from replay.bench.session import run_bench
from tests.replay.test_bench_presets import assert_fill_covers, columns
from tests.replay.test_bench_runs import bench_cli, check_results_set, make_file
from tests.replay.test_run_end_to_end import marks, on_loop, uring
from traces import schema

MIB = 1 << 20
SECTOR = 512


def discard_counters(device: str) -> tuple[int, int]:
    """(discards completed, sectors discarded): fields 12 and 14 of /sys/block/loopN/stat
    (Documentation/block/stat.rst), counted by the block layer as the requests complete."""
    fields = Path(f"/sys/block/{Path(device).name}/stat").read_text().split()
    if len(fields) < 15:
        pytest.skip("this kernel's block stat has no discard fields (Linux 4.18+)")
    return int(fields[11]), int(fields[13])


def spans(path):
    c = columns(path)
    return c["op"], c["offset"], c["offset"] + c["length"]


@marks(uring, on_loop)
def test_op_25_discards_the_whole_loop_device_then_stays_in_its_first_75_percent(loop_device, tmp_path):
    device = loop_device(32 * MIB)
    out = tmp_path / "op"
    before = discard_counters(device)
    done = bench_cli("steady", device, "--op", "25", "--duration", "2", "--window", "1",
                     "--round", "1", "-o", out)
    assert done.returncode == 0, done.stderr
    discards, sectors = (a - b for a, b in zip(discard_counters(device), before))
    assert discards >= 1 and sectors == 32 * MIB // SECTOR  # the whole device, nothing more

    results = check_results_set(out, "steady")
    assert [r["name"] for r in results["runs"]] == ["op25-discard", "op25-fill", "op25-steady"]
    assert results["op"] == [{"op": 25, "discarded_bytes": 32 * MIB, "limit_bytes": 24 * MIB,
                              "span": 24 * MIB, "scores": None}]
    assert results["options"]["op"] == [25] and results["span"] == 24 * MIB
    op, start, end = spans(out / "op25-discard.parquet")
    assert (op == schema.Op.DISCARD).all() and start.min() == 0 and end.max() == 32 * MIB
    assert_fill_covers(out / "op25-fill.parquet", 24 * MIB)  # the fill, too, stops at 75 %
    op, start, end = spans(out / "op25-steady.parquet")
    assert (op == schema.Op.WRITE).all() and len(op) > 1000
    assert start.min() >= 0 and end.max() <= 24 * MIB
    assert end.max() > 23 * MIB  # and uses the whole 75 %, not less
    assert results["scores"]["steady_iops"] > 0
    assert ("25 % over-provisioning: the whole target (33,554,432 bytes) discarded, then every "
            "I/O in its first 25,165,824 bytes (75 %)") in done.stdout


def test_op_on_a_file_punches_out_what_was_written_before(tmp_path):
    target = tmp_path / "disk.img"
    target.write_bytes(os.urandom(16 * MIB))  # every block allocated
    out = tmp_path / "op"
    results = run_bench("steady", str(target), out,
                        BenchOptions(op=(50,), duration_s=0.5, window_s=1, round_s=1))
    assert [r["name"] for r in results["runs"]] == ["op50-discard", "op50-fill", "op50-steady"]
    # Holes where the discard went and nothing wrote since: the second half holds no blocks.
    assert os.stat(target).st_blocks * SECTOR <= 8 * MIB + MIB
    assert os.stat(target).st_size == 16 * MIB
    _, _, end = spans(out / "op50-steady.parquet")
    assert end.max() <= 8 * MIB


def test_an_op_pass_that_cannot_hold_the_span_or_fill_is_refused_before_a_write(tmp_path):
    target = make_file(tmp_path / "small.img", 16 * MIB)
    with pytest.raises(BenchError, match=r"spans 16\.0 MiB .* but --op 25 leaves 12\.0 MiB "
                                         r"\(12582912 bytes\) of .*; give --span 12582912 or less"):
        run_bench("steady", target, tmp_path / "out", BenchOptions(op=(25,), span=16 * MIB))
    with pytest.raises(BenchError, match="--fill must be between 1 byte and the 12582912 bytes --op 25"):
        run_bench("steady", target, tmp_path / "out", BenchOptions(op=(0, 25), fill_bytes=16 * MIB))
    with pytest.raises(BenchError, match="each over-provisioning percent once"):
        run_bench("steady", target, tmp_path / "out", BenchOptions(op=(25, 25)))
    done = bench_cli("steady", target, "--op", "91", "-o", tmp_path / "out")
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: --op takes a whole percent of the target to leave unused, from 0 to 90, not '91'")
    assert not (tmp_path / "out").exists()
    assert np.count_nonzero(np.fromfile(target, np.uint8)) == 0  # nothing was discarded or written


def test_a_preset_op_given_on_the_command_line_is_an_override(tmp_path):
    done = bench_cli("seed003-steady", "--engine", "null", "--span", "16M", "--scale", "0.0006",
                     "--op", "25", "-o", tmp_path / "s")
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "s" / "results.json").read_text())
    assert results["preset"]["overrides"] == ["op", "span"]
    assert [p["op"] for p in results["op"]] == [25]  # the 25 % run alone
    assert [r["name"] for r in results["runs"]] == ["op25-discard", "op25-fill", "op25-steady"]


def test_the_report_draws_each_pass_as_seed_003_does_default_and_over_provisioned(tmp_path, monkeypatch):
    from analysis import plots, report

    out = tmp_path / "s"
    results = run_bench("steady", None, out, BenchOptions(engine="null", span=16 * MIB, op=(0, 25),
                                                          duration_s=3, window_s=1, round_s=1))
    drawn = {}
    for name in ("steady_rounds", "over_time", "scored_window"):
        original = getattr(plots, name)

        def spy(data, *args, _name=name, _original=original, **kwargs):
            drawn[_name] = data
            return _original(data, *args, **kwargs)

        monkeypatch.setattr(plots, name, spy)
    report.build_report([out], tmp_path / "r.html", labels=["t"])
    labels = ["t: steady, default capacity", "t: steady, 25 % over-provisioning"]
    assert set(drawn) == {"steady_rounds", "over_time", "scored_window"}
    for name in drawn:
        assert list(drawn[name]) == labels, name
    for label, scores in zip(labels, (results["scores"], results["scores"]["op25"])):
        assert list(drawn["steady_rounds"][label]) == scores["round_iops"]
        assert list(drawn["over_time"][label][1]) == scores["iops_series"]
        assert drawn["scored_window"][label][2] == scores["window_s"]
    assert results["scores"]["iops_series"] != results["scores"]["op25"]["iops_series"]
