"""Every command that writes refuses, in one line with exit 2 and before writing a byte, a
path whose writing would destroy something: a device node, the target, the trace or another
input, an image behind a loop device, a block device behind a loop device in use, a file that
exists (unless --force) or that another process is writing; and one that finds no room says so
in one line, a capture keeping its trace elsewhere. Real loop devices, mounts, nodes."""
import contextlib
import hashlib
import os
import shutil
import stat
import subprocess

import numpy as np
import pytest

from tests.cli_process import refused, replay_cli, replay_process, wait_for
from traces import library
from traces.convert import export_trace
from traces.schema import Op
from traces.trace import read_trace

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


# ---- 2. -o at a device node -----------------------------------------------------------------


@pytest.mark.root
def test_run_results_at_a_character_device_node_are_refused(tmp_path):
    node = node_like(tmp_path / "null", "/dev/null")
    done = replay_cli("run", "demo", "--engine", "null", "--speed", "100", "-o", node)
    refused(done, f"{node} is a character device")
    assert stat.S_ISCHR(os.stat(node).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["null"]


@pytest.mark.root
@pytest.mark.loopdev
def test_run_results_at_the_block_target_itself_are_refused(tmp_path, loop_device):
    device = node_like(tmp_path / "b", loop_device(16 * MIB))
    image = tmp_path / "disk0.img"
    before = digest(image)
    done = replay_cli("run", "demo", device, "--afap", "--remap", "wrap", "-o", device)
    refused(done, f"{device} is a block device")
    assert stat.S_ISBLK(os.stat(device).st_mode) and digest(image) == before


@pytest.mark.root
@pytest.mark.loopdev
def test_capture_to_a_device_node_is_refused_before_tracing(tmp_path, loop_device):
    device = loop_device(16 * MIB)
    node = node_like(tmp_path / "null", "/dev/null")
    done = replay_cli("capture", device, "-o", node, "--duration", "0.2")
    refused(done, f"{node} is a character device")
    assert stat.S_ISCHR(os.stat(node).st_mode)


@pytest.mark.root
@pytest.mark.parametrize("command", ["import", "export"])
def test_import_and_export_to_a_device_node_are_refused(tmp_path, demo, command):
    node = node_like(tmp_path / "null", "/dev/null")
    refused(replay_cli(*_writes(command, tmp_path, demo, node)), f"{node} is a character device")
    assert stat.S_ISCHR(os.stat(node).st_mode)


@pytest.mark.root
def test_bench_results_over_a_device_node_are_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    node = node_like(out / "results.json", "/dev/null")
    done = replay_cli("bench", "mix", "--engine", "null", "-o", out, "--duration", "0.05",
                      "--no-fill", "--qd", "1", "--read-shares", "100")
    refused(done, f"{node} is a character device")
    assert stat.S_ISCHR(os.stat(node).st_mode) and os.listdir(out) == ["results.json"]


# ---- 3. the trace as the target ------------------------------------------------------------


@pytest.mark.parametrize("flags", [[], ["--destroy-data"]], ids=["plain", "destroy-data"])
def test_the_trace_is_never_the_target(tmp_path, demo, flags):
    before = digest(demo)
    done = replay_cli("run", demo, demo, "--afap", "--remap", "wrap", *flags, "-o", tmp_path / "out.parquet")
    refused(done, f"the target {demo} is the trace being replayed")
    assert digest(demo) == before and not (tmp_path / "out.parquet").exists()


# ---- 4. capture, import and export check -o too --------------------------------------------


@pytest.mark.root
@pytest.mark.loopdev
def test_capture_never_replaces_the_image_behind_its_device(tmp_path, loop_device):
    device = loop_device(16 * MIB)
    image = tmp_path / "disk0.img"
    before = digest(image)
    done = replay_cli("capture", device, "-o", image, "--duration", "0.2")
    refused(done, f"{image} backs {device}")
    assert image.stat().st_size == 16 * MIB and digest(image) == before


def test_import_never_replaces_its_input(tmp_path, demo):
    source = tmp_path / "d.csv"
    export_trace(demo, "csv", source)
    before = digest(source)
    done = replay_cli("import", source, "-o", source)
    refused(done, f"{source} is an input")
    assert digest(source) == before


def test_export_never_replaces_the_trace(tmp_path, demo):
    before = digest(demo)
    done = replay_cli("export", demo, "--format", "csv", "-o", demo)
    refused(done, f"{demo} is the trace being exported")
    assert digest(demo) == before


# ---- 5. one -o, one writer -----------------------------------------------------------------


def _writes(command, tmp_path, demo, out):
    """The arguments of `command` writing `out` quickly, without root."""
    if command == "run":
        return ["run", demo, "--engine", "null", "--afap", "-o", out]
    if command == "import":
        export_trace(demo, "csv", tmp_path / "d.csv")
        return ["import", tmp_path / "d.csv", "-o", out]
    return ["export", demo, "--format", "csv", "-o", out]


@pytest.mark.parametrize("command", ["run", "import", "export"])
def test_an_existing_output_is_replaced_only_with_force(tmp_path, demo, command):
    out = tmp_path / "out.file"
    out.write_text("an earlier result")
    args = _writes(command, tmp_path, demo, out)
    refused(replay_cli(*args), f"{out} already exists", "--force")
    assert out.read_text() == "an earlier result"
    done = replay_cli(*args, "--force")
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > len("an earlier result")


@pytest.mark.parametrize("force", [[], ["--force"]], ids=["plain", "force"])
def test_a_second_run_into_an_output_being_written_is_refused(tmp_path, demo, force):
    out = tmp_path / "out.parquet"
    # The demo's 10 s at original timing: long enough to start the second run meanwhile.
    with replay_process("run", demo, "--engine", "null", "-o", out) as first:
        wait_for(first, lambda: list(tmp_path.glob("out.parquet.*.partial")), "the first run's start")
        second = replay_cli("run", demo, "--engine", "null", "--afap", "-o", out, *force)
        refused(second, f"another process is writing {out}")
        assert first.poll() is None
        first.send_signal(2)
        first.communicate(timeout=60)
    assert first.returncode == 130
    from traces.trace import open_trace

    assert open_trace(out).metadata["interrupted"] is True  # the first run's rows, not the second's


# ---- a full filesystem under -o --------------------------------------------------------------


@pytest.mark.root
@pytest.mark.parametrize("command", ["import", "export"])
def test_import_and_export_onto_a_full_filesystem_say_so_in_one_line(tmp_path, demo, command, tmpfs):
    full = tmpfs("8k")  # two pages: no trace fits
    out = full / "out"
    refused(replay_cli(*_writes(command, tmp_path, demo, out)),
            f"cannot write {out}: No space left on device; nothing was written")
    assert os.listdir(full) == []


@pytest.mark.root
@pytest.mark.loopdev
def test_a_capture_that_finds_no_room_is_kept_in_the_temporary_directory(tmp_path, loop_device, tmpfs):
    device = loop_device(16 * MIB)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    full = tmpfs("8k")
    out = full / "c.parquet"
    with replay_process("capture", device, "-o", out, "--", "dd", "if=/dev/urandom", f"of={device}",
                        "bs=4k", "count=2000", "oflag=direct", env={"TMPDIR": str(tmpdir)}) as proc:
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "Traceback" not in stderr, stderr
    [kept] = tmpdir.glob("tracereplay-capture-*-c.parquet")
    assert stderr.splitlines()[-1] == (f"error: cannot write {out}: No space left on device; the "
                                       f"capture is kept in {kept} instead: move it where it belongs")
    assert os.listdir(full) == []
    cols, _ = read_trace(kept)
    writes = cols["op"] == Op.WRITE
    assert np.count_nonzero(writes) >= 2000 and np.all(cols["length"][writes] == 4096)
