"""The blktrace backend: a probe for whether blktrace can open its relay files here, and a run.

Under kernel lockdown blktrace fails with EPERM on debugfs and then hangs instead of exiting,
so the probe watches its stderr for a bounded time and ends it by pid.
"""
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from traces.capture.tracefs import CaptureError
from traces.formats import blktrace as blktrace_format

DEBUGFS = Path("/sys/kernel/debug")
PROBE_SECONDS = 1.5


def _debugfs_mounted() -> bool:
    return (DEBUGFS / "block").is_dir()


def _end(proc: subprocess.Popen) -> None:
    """SIGINT (blktrace tears its trace down on it), then SIGKILL if it does not exit."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def probe(device: str) -> str | None:
    """None if blktrace can trace `device` here, else the reason it cannot."""
    from shutil import which

    if which("blktrace") is None:
        return "blktrace is not installed (Debian package blktrace)"
    mounted = False
    if not _debugfs_mounted():
        done = subprocess.run(["mount", "-t", "debugfs", "none", str(DEBUGFS)], capture_output=True, text=True)
        if done.returncode != 0:
            return f"cannot mount debugfs ({done.stderr.strip()})"
        mounted = True
    try:
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(["blktrace", "-d", device, "-o", "-"], stdout=subprocess.DEVNULL,
                                    stderr=err)
            deadline = time.monotonic() + PROBE_SECONDS
            text = ""
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
                err.seek(0)
                text = err.read().decode(errors="replace")
                if "FAILED" in text:  # it prints this once every CPU failed, then hangs
                    break
            _end(proc)
            err.seek(0)
            text = err.read().decode(errors="replace")
        if "Operation not permitted" in text or "FAILED" in text or "failed" in text:
            first = next((line for line in text.splitlines() if line.strip()), text)
            return f"blktrace cannot open its relay files ({first.strip()}); kernel lockdown?"
        if proc.returncode not in (0, -signal.SIGINT, None) and text.strip():
            return f"blktrace failed: {text.strip().splitlines()[0]}"
        return None
    finally:
        if mounted:
            subprocess.run(["umount", str(DEBUGFS)], capture_output=True)


class BlktraceSession:
    """blktrace -d DEVICE -o - into a temporary file, decoded after it stops."""

    def __init__(self, device: str):
        self.device = device
        self.proc = None
        self.path = None
        self._mounted = False

    def __enter__(self):
        if not _debugfs_mounted():
            done = subprocess.run(["mount", "-t", "debugfs", "none", str(DEBUGFS)], capture_output=True)
            self._mounted = done.returncode == 0
        fd, name = tempfile.mkstemp(prefix="tracereplay-", suffix=".blktrace")
        self.path = Path(name)
        with os.fdopen(fd, "wb") as out:
            self.proc = subprocess.Popen(["blktrace", "-d", self.device, "-o", "-"], stdout=out,
                                         stderr=subprocess.PIPE)
        time.sleep(0.5)  # blktrace sets up its per-CPU threads before it records
        if self.proc.poll() is not None:
            err = self.proc.stderr.read().decode(errors="replace").strip()
            self.close()
            raise CaptureError(f"blktrace exited at start: {err}")
        return self

    def stop(self):
        if self.proc is not None:
            _end(self.proc)

    def read(self, options=None):
        return blktrace_format.read([self.path], dict(options or {"event": "issue"}))

    def close(self):
        self.stop()
        if self.proc is not None and self.proc.stderr:
            self.proc.stderr.close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)
        if self._mounted:
            subprocess.run(["umount", str(DEBUGFS)], capture_output=True)
            self._mounted = False

    def __exit__(self, *exc):
        self.close()
