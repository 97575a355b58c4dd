"""The `replay` command run as the console script runs it, from the tests: to completion
(`replay_cli`) or as a process to signal mid-run (`replay_process`)."""
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "from replay.cli import main; main()"]
# This tree's packages from any working directory, and help wide enough never to wrap a flag.
ENV = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}


def replay_cli(*args, cwd=None, timeout=120, **popen) -> subprocess.CompletedProcess:
    """Run `replay ARGS` to its end; returns the CompletedProcess with text output."""
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=ENV, **popen)


@contextlib.contextmanager
def replay_process(*args, env=None, **popen):
    """`replay ARGS...` with text pipes for stdout and stderr, `env` added to the environment;
    killed and reaped however the block ends, so a failed assertion leaves no process behind."""
    proc = subprocess.Popen([*CLI, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**ENV, **(env or {})}, **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def wait_for(proc, ready, what: str, timeout: float = 60) -> None:
    """Poll `ready()` until it is true; fail if `proc` exits first or `timeout` s pass."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.02)


def refused(done, *words) -> str:
    """The one line of a refusal (exit 2, `error: ...`, no traceback), holding each of `words`."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def one_line(stderr, word) -> str:
    """The one line of `stderr` that holds `word`; fails on a traceback or on several lines."""
    assert "Traceback" not in stderr, stderr
    said = [line for line in stderr.splitlines() if word in line]
    assert len(said) == 1, stderr
    return said[0]
