"""A capture ends on SIGINT, SIGTERM or SIGHUP wherever the signal lands, and refuses a
--duration that would never end. The signal is raised for real, at every line the wait runs
(threading's included), so a handler that takes a lock the interrupted line holds hangs here."""
import subprocess
import sys
import textwrap

import pytest

from tests.cli_process import ENV
from traces.capture import CaptureError, capture

# In a child process, since the failure is a hang: for k = 1, 2, ..., raise SIGTERM just
# before the k-th line the wait executes, until a wait runs out of lines before it blocks.
_EVERY_LINE = textwrap.dedent("""
    import signal, sys, time
    from traces.capture import _Stopper, _wait

    k = 0
    while True:
        k += 1
        seen, fired = 0, None
        def trace(frame, event, arg):
            global seen, fired
            if event == "line":
                seen += 1
                if seen == k:
                    fired = time.monotonic()
                    signal.raise_signal(signal.SIGTERM)
            return trace
        with _Stopper() as stopper:
            sys.settrace(trace)
            try:
                ended = _wait(stopper, None, time.monotonic() + 0.1)
            finally:
                sys.settrace(None)
            took = time.monotonic() - (fired or 0)
        if fired is None:  # the wait ended before its k-th line: every line was tried
            break
        assert stopper.signal == signal.SIGTERM, (k, stopper.signal)
        assert took < 0.05, f"the signal before line {k} ended the wait only after {took:.2f} s"
    print(k - 1, "lines")
""")


def test_a_stop_signal_at_any_line_of_the_wait_ends_it():
    try:
        run = subprocess.run([sys.executable, "-c", _EVERY_LINE], capture_output=True, text=True,
                             env=ENV, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("a SIGTERM during the capture's wait hung it (the handler waits for a lock "
                    "the interrupted line holds)")
    assert run.returncode == 0, run.stderr
    assert int(run.stdout.split()[0]) >= 5, run.stdout  # the trace did reach the wait's lines


@pytest.mark.parametrize("duration", [float("nan"), float("inf"), 1e308, -1.0, 0.0])
def test_a_duration_that_never_ends_or_never_starts_is_refused(tmp_path, duration):
    with pytest.raises(CaptureError, match=r"--duration takes a number of seconds above 0 and at most "
                                           r"31,536,000 \(a year\)"):
        capture("/dev/null", tmp_path / "t.parquet", duration=duration)
    assert list(tmp_path.iterdir()) == []
