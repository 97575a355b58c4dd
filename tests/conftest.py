"""Shared fixtures: loop devices backed by sparse files in tmp_path, detached however a test ends.

Loop tests need root and losetup; elsewhere they skip with that reason. CI is root and runs them.
"""
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from bench import targets
from tests.conftest_targets import drive_pair  # noqa: F401  (the two-drive fixture)

MIB = 1 << 20

_why_no_root = "needs root (block device ioctls, mount)" if os.geteuid() != 0 else None
_why_no_loop = _why_no_root or (
    "needs losetup (Debian package mount)" if shutil.which("losetup") is None else None
)


def pytest_configure(config):
    """The signal tests send SIGINT, SIGTERM and SIGHUP to runs. A shell that starts the suite
    in the background (`make test &`, `nohup`) ignores SIGINT or SIGHUP, and an ignored signal
    stays ignored in every process started from it: put back the dispositions a terminal gives."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def pytest_collection_modifyitems(items):
    """Skip, with the reason, tests marked `root` or `loopdev` where the machine lacks it."""
    for item in items:
        for marker, why in (("root", _why_no_root), ("loopdev", _why_no_loop)):
            if why and item.get_closest_marker(marker):
                item.add_marker(pytest.mark.skip(reason=why))


def _run(*args: str, stdin: str | None = None) -> str:
    return subprocess.run(args, input=stdin, check=True, capture_output=True, text=True).stdout


def _loop_devices() -> list[dict]:
    """Every attached loop device, as losetup --json reports it."""
    listing = _run("losetup", "--list", "--json", "--output", "NAME,BACK-FILE")
    return json.loads(listing or "{}").get("loopdevices", [])


@pytest.fixture
def loop_device(tmp_path):
    """A factory: loop_device(size, partscan=False) attaches a sparse file and returns /dev/loopN."""
    attached = []

    def attach(size: int = 64 * MIB, *, partscan: bool = False) -> str:
        image = tmp_path / f"disk{len(attached)}.img"
        with open(image, "wb") as f:
            f.truncate(size)
        flags = ["--partscan"] if partscan else []
        device = _run("losetup", "--direct-io=on", *flags, "--find", "--show", str(image)).strip()
        attached.append(device)
        return device

    try:
        yield attach
    finally:
        for device in reversed(attached):
            subprocess.run(["losetup", "--detach", device], capture_output=True)


@pytest.fixture
def mounted(tmp_path):
    """A factory: mounted(device, *options) mounts it (with mount's `options`) on a new
    directory, unmounted however the test ends."""
    mountpoints = []

    def mount(device: str, *options: str) -> Path:
        where = tmp_path / f"mnt{len(mountpoints)}"
        where.mkdir()
        _run("mount", *options, device, str(where))
        mountpoints.append(where)
        return where

    try:
        yield mount
    finally:
        for where in reversed(mountpoints):
            subprocess.run(["umount", str(where)], capture_output=True)


@pytest.fixture
def tmpfs(mounted):
    """A factory: tmpfs(size) mounts a real tmpfs of `size` ("1m", "8k") on a new directory,
    unmounted however the test ends: writes past its room fail with ENOSPC."""
    return lambda size: mounted("tracereplay-test", "-t", "tmpfs", "-o", f"size={size}")


@pytest.fixture(scope="session", autouse=True)
def _detach_leftover_loops(tmp_path_factory):
    """Safety net: after the session, detach loop devices backed by this session's tmp files.

    Only this session's base directory: other pytest runs on the machine own theirs.
    """
    yield
    if _why_no_loop is not None:
        return
    base = str(tmp_path_factory.getbasetemp().resolve())
    for entry in _loop_devices():
        back = entry.get("back-file") or ""
        if back.startswith(base + os.sep):
            subprocess.run(["umount", "--all-targets", entry["name"]], capture_output=True)
            subprocess.run(["losetup", "--detach", entry["name"]], capture_output=True)


@pytest.fixture
def zram():
    """/dev/zram0 set up with 64 MiB, reset however the test ends: a block device whose driver
    takes bios directly (no blk-mq) and serves them synchronously. A zram0 already set up is
    someone else's and is left alone (the test fails saying so)."""
    if _why_no_root:
        pytest.skip(_why_no_root)
    sysfs = Path(targets.ZRAM)
    if not sysfs.exists():
        subprocess.run(["modprobe", "zram"], capture_output=True)
    assert sysfs.exists(), "no /dev/zram0 and `modprobe zram` did not make one"
    assert (sysfs / "disksize").read_text().strip() == "0", (
        "/dev/zram0 is already in use; reset it (echo 1 > /sys/block/zram0/reset) if it is yours")
    (sysfs / "disksize").write_text(str(64 * MIB))
    try:
        yield "/dev/zram0"
    finally:
        targets.reset_zram()
