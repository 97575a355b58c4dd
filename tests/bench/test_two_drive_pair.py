"""The two-drive pair of bench/targets.py: the throttled drive really limits our engine (read
by the cgroup's own counters and the run's duration), and everything is removed afterwards."""
import json
import os
from pathlib import Path

import pytest

from bench import targets
from synth.generators import random_mix, to_trace

MIB = 1 << 20
pytestmark = [pytest.mark.root, pytest.mark.loopdev]


def _mix(path, count, read_share=0.7):
    to_trace(random_mix(block_size=4096, read_share=read_share, span=64 * MIB, span_start=0,
                        count=count, queue_depth=32, seed=3), path)
    return path


@pytest.mark.parametrize("engine", ["io_uring", "psync"])
def test_throttle_limits_our_engine(drive_pair, tmp_path, engine):
    trace = _mix(tmp_path / "mix.parquet", 3000, read_share=1.0)
    before = drive_pair.throttle.serviced().get("read", 0)
    done = drive_pair.replay(drive_pair.slow, "run", trace, drive_pair.slow, "--afap", "--qd", "32",
                             "--engine", engine, "--json", "--destroy-data", "-o", tmp_path / "r.parquet")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)["tracereplay"]
    assert summary["total_ios"] == 3000
    # The cgroup's counters saw every read: the I/O was charged to the group, io-wq or not.
    assert drive_pair.throttle.serviced()["read"] - before >= 3000
    # 3,000 reads under a 2,000 IOPS limit cannot finish in much under 1.5 s, however fast
    # the machine (the limiter allows a short initial burst).
    assert summary["duration_ns"] >= 1.0e9


def test_fast_drive_is_not_throttled(drive_pair, tmp_path):
    trace = _mix(tmp_path / "mix.parquet", 2000)
    before = drive_pair.throttle.serviced()
    done = drive_pair.replay(drive_pair.fast, "run", trace, drive_pair.fast, "--afap", "--json",
                             "--destroy-data", "-o", tmp_path / "r.parquet")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tracereplay"]["total_ios"] == 2000
    assert drive_pair.throttle.serviced() == before


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (loop devices, cgroup files)")
def test_pair_is_removed_even_on_failure():
    seen = {}
    with pytest.raises(RuntimeError, match="boom"):
        with targets.drive_pair(32 * MIB, riops=500) as (fast, slow, throttle):
            seen.update(group=throttle.path, backing=[
                Path(f"/sys/block/{Path(d).name}/loop/backing_file").read_text().strip() for d in (fast, slow)])
            assert seen["backing"][0].startswith(targets.SHM + "/")
            assert throttle.limits == {"riops": 500, "wiops": 2000, "rbps": 64 * MIB, "wbps": 64 * MIB}
            raise RuntimeError("boom")
    assert not Path(seen["group"]).exists()
    for backing in seen["backing"]:
        assert not Path(backing).exists()
    attached = json.loads(os.popen("losetup --list --json").read() or "{}").get("loopdevices", [])
    assert not [d for d in attached if d.get("back-file") in seen["backing"]]
