"""Every command that writes refuses, in one line with exit 2 and before writing a byte, a
path whose writing would destroy something: a device node, the target, the trace or another
input, an image behind a loop device, a block device behind a loop device in use, a file that
exists (unless --force) or that another process is writing. Real loop devices, mounts, nodes."""
import contextlib
import hashlib
import os
import shutil
import stat
import subprocess

import pytest

from tests.cli_process import refused, replay_cli, replay_process, wait_for
from traces import library
from traces.convert import export_trace

MIB = 1 << 20
needs_mkfs = pytest.mark.skipif(shutil.which("mkfs.ext4") is None, reason="needs mkfs.ext4")


def digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def node_like(path, device: str) -> str:
    """A device node at `path` for the same device as `device` (a copy of its /dev node)."""
    st = os.stat(device)
    os.mknod(path, (st.st_mode & 0o170000) | 0o600, st.st_rdev)
    return str(path)


@pytest.fixture
def demo(tmp_path):
    """A copy of the bundled demo trace (10 s, 1 GiB span, reads and writes)."""
    path = tmp_path / "d.parquet"
    shutil.copy(library.resolve("demo"), path)
    return path


@contextlib.contextmanager
def stacked_and_mounted(lower: str, tmp_path):
    """A loop device over the block device `lower`, 1 MiB in (`losetup -o 1M B A`), holding
    an ext4 mounted on tmp_path/mnt; unmounted and detached however the block ends."""
    upper, where = None, tmp_path / "mnt"
    where.mkdir()
    mounted = False
    try:
        upper = subprocess.run(["losetup", "--find", "--show", "--offset", str(MIB), lower],
                               check=True, capture_output=True, text=True).stdout.strip()
        # No lazy init: the mounted filesystem then writes nothing while the test looks.
        subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0",
                        upper], check=True, capture_output=True)
        subprocess.run(["mount", upper, str(where)], check=True, capture_output=True)
        mounted = True
        (where / "precious").write_text("data in use")
        subprocess.run(["sync"], check=True)
        yield upper, where
    finally:
        if mounted:
            subprocess.run(["umount", str(where)], capture_output=True)
        if upper:
            subprocess.run(["losetup", "--detach", upper], capture_output=True)


# ---- 1. a block device that backs a loop device in use ------------------------------------


@pytest.mark.root
@pytest.mark.loopdev
@needs_mkfs
@pytest.mark.parametrize("flags", [[], ["--destroy-data"], ["--dry-run"]], ids=["plain", "destroy-data", "dry-run"])
def test_a_block_device_behind_a_mounted_loop_device_is_refused(tmp_path, loop_device, flags):
    # Nothing in the kernel stops it: loop devices open their backing device without a claim.
    lower = loop_device(32 * MIB)
    image, out = tmp_path / "disk0.img", tmp_path / "out.parquet"
    with stacked_and_mounted(lower, tmp_path) as (upper, where):
        before = digest(image)
        done = replay_cli("run", "demo", lower, "--afap", "--remap", "wrap", *flags, "-o", out)
        refused(done, f"refusing to write to {lower}", f"it backs {upper}, which is mounted ({upper} on {where})",
                "losetup -d")
        assert digest(image) == before and not out.exists()
        assert (where / "precious").read_text() == "data in use"


@pytest.mark.root
@pytest.mark.loopdev
def test_a_block_device_behind_an_idle_loop_device_needs_destroy_data(tmp_path, loop_device):
    lower = loop_device(32 * MIB)
    upper = subprocess.run(["losetup", "--find", "--show", "--offset", str(MIB), lower],
                           check=True, capture_output=True, text=True).stdout.strip()
    try:
        done = replay_cli("run", "demo", lower, "--afap", "--remap", "wrap", "-o", tmp_path / "out.parquet")
        refused(done, f"it backs the loop device {upper}", "--destroy-data")
        done = replay_cli("run", "demo", lower, "--afap", "--remap", "wrap", "--destroy-data",
                          "-o", tmp_path / "out.parquet")
        assert done.returncode == 0, done.stderr
    finally:
        subprocess.run(["losetup", "--detach", upper], capture_output=True)
