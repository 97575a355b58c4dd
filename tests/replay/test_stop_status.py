"""A stop signal gives its own exit status (128 + the signal) at every stage of a run, the
calibration before a causal replay included, and leaves nothing of that stage behind."""
import signal

import numpy as np
import pytest

from tests.cli_process import replay_process, wait_for
from traces.schema import Op
from traces.trace import write_trace


def _chain(path, n=300):
    rows = np.arange(n, dtype=np.int64)
    write_trace(path, {"ts_ns": rows * 200_000, "op": np.where(rows % 3 == 2, Op.WRITE, Op.READ).astype(np.uint8),
                       "offset": rows * 4096, "length": np.full(n, 4096, np.int64),
                       "latency_ns": np.full(n, 100_000, np.int64), "pid": np.ones(n, np.int32)},
                {"name": path.stem})
    return path


@pytest.mark.root
@pytest.mark.loopdev
def test_sigterm_during_the_causal_calibration_exits_143(tmp_path, loop_device):
    dev = loop_device(64 << 20)
    trace, out, tmp = _chain(tmp_path / "chain.parquet"), tmp_path / "out.parquet", tmp_path / "tmp"
    tmp.mkdir()
    with replay_process("run", trace, dev, "--timing", "causal", "--destroy-data", "-o", out,
                        env={"TMPDIR": str(tmp)}) as proc:
        # The probe replay's log appears once the calibration's capture is recording.
        wait_for(proc, lambda: list(tmp.glob("tracereplay-calibrate-*/probe.log")), "the calibration")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM" in err and "Ctrl-C" not in err and "Traceback" not in err, err
    assert not out.exists() and list(tmp.iterdir()) == []
