"""Targets on real loop devices: measuring them, and refusing to write over data in use."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from replay.targets import scratch_target
from traces.errors import TargetError, UnsafeTargetError
from traces.targets import Target, check_safe_to_write, inspect_target

MIB = 1 << 20


def needs(tool):
    return pytest.mark.skipif(shutil.which(tool) is None, reason=f"needs {tool}")


def run(*args, stdin=None):
    subprocess.run(args, input=stdin, check=True, capture_output=True, text=True)


def refusal(target):
    with pytest.raises(UnsafeTargetError) as err:
        check_safe_to_write(target, destroy_data=False)
    assert "--destroy-data" in str(err.value) and "--read-only" in str(err.value)
    check_safe_to_write(target, destroy_data=True)
    return str(err.value)


@pytest.mark.root
@pytest.mark.loopdev
def test_a_loop_device_is_measured(loop_device, tmp_path):
    device = loop_device(48 * MIB)
    target = inspect_target(device)
    assert target.kind == "block" and target.path == device
    assert target.size == 48 * MIB
    assert target.logical_block_size == 512
    assert target.physical_block_size >= 512
    assert target.backing_file == str(tmp_path / "disk0.img")
    assert target.model == "disk0.img"
    st = os.stat(device)
    assert target.dev == f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def test_a_regular_file_is_a_target(tmp_path):
    path = tmp_path / "disk.img"
    path.write_bytes(b"\0" * 12345)
    target = inspect_target(str(path))
    assert target.kind == "file" and target.path == str(path)
    assert target.size == 12345
    assert target.logical_block_size == 4096
    assert target.dev is None and target.backing_file is None
    check_safe_to_write(target, destroy_data=False)


@pytest.mark.parametrize("name, what", [("missing.img", "does not exist"), (".", "is a directory")])
def test_not_a_file_or_device_is_refused(tmp_path, name, what):
    expected = f"{what}; pass a block device such as /dev/sdb or a regular file"
    with pytest.raises(TargetError, match=expected):
        inspect_target(str(tmp_path / name))


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="needs /dev/null")
def test_a_character_device_is_refused():
    with pytest.raises(TargetError, match="character device, not a block device"):
        inspect_target("/dev/null")


def test_scratch_target_is_sparse_rounded_up_and_cleaned_up(tmp_path):
    target, cleanup = scratch_target(5 * MIB + 1, str(tmp_path))
    try:
        assert target.kind == "file" and target.size == 6 * MIB
        assert os.stat(target.path).st_blocks == 0
        assert Path(target.path).parent.parent == tmp_path
    finally:
        cleanup()
    assert not Path(target.path).parent.exists()
    cleanup()


def test_scratch_target_refuses_more_than_the_free_space(tmp_path):
    fs = os.statvfs(tmp_path)
    free = fs.f_bavail * fs.f_frsize
    expected = rf"needs .* but {re.escape(str(tmp_path))} has .* bytes\) free"
    with pytest.raises(TargetError, match=expected):
        scratch_target(free + 64 * MIB, str(tmp_path))
    assert list(tmp_path.iterdir()) == []
    _, cleanup = scratch_target(free + 64 * MIB, str(tmp_path), writes=False)
    cleanup()


@pytest.mark.root
@pytest.mark.loopdev
def test_an_empty_loop_device_is_safe_to_write(loop_device):
    check_safe_to_write(inspect_target(loop_device()), destroy_data=False)


@pytest.mark.root
@pytest.mark.loopdev
@needs("mkfs.ext4")
def test_a_filesystem_is_refused(loop_device):
    device = loop_device()
    run("mkfs.ext4", "-q", device)
    assert "ext4" in refusal(inspect_target(device))


@pytest.mark.root
@pytest.mark.loopdev
@needs("mkfs.ext4")
def test_a_mounted_device_is_refused(loop_device, mounted):
    device = loop_device()
    run("mkfs.ext4", "-q", device)
    where = mounted(device)
    message = refusal(inspect_target(device))
    assert f"mounted ({device} on {where})" in message


@pytest.mark.root
@pytest.mark.loopdev
@needs("sfdisk")
def test_a_partition_table_is_refused(loop_device):
    device = loop_device()
    run("sfdisk", "--no-reread", "--no-tell-kernel", device, stdin="label: gpt\n")
    assert "gpt partition table" in refusal(inspect_target(device))


@pytest.mark.root
@pytest.mark.loopdev
@needs("sfdisk")
@needs("mkfs.ext4")
def test_a_disk_whose_partition_is_mounted_is_refused(loop_device, mounted):
    device = loop_device(partscan=True)
    run("sfdisk", device, stdin="label: gpt\n,,L\n")
    part = device + "p1"
    if not os.path.exists(part) and shutil.which("partx"):
        run("partx", "--add", device)  # some kernels ignore the re-read on loop devices
    if not os.path.exists(part):
        pytest.skip(f"the kernel made no {part} node (partscan unsupported here)")
    run("mkfs.ext4", "-q", part)
    where = mounted(part)
    message = refusal(inspect_target(device))
    assert f"mounted ({part} on {where})" in message
    assert f"has partitions ({os.path.basename(part)})" in message


@pytest.mark.root
@pytest.mark.loopdev
def test_the_fallback_magic_check_finds_a_signature(loop_device, monkeypatch):
    device = loop_device()
    with open(device, "r+b") as f:
        f.seek(65600)
        f.write(b"_BHRfS_M")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "btrfs filesystem (magic at byte 65600)" in refusal(inspect_target(device))


def _root_device():
    """The /dev node and MAJ:MIN of the device holding /, found without traces.targets."""
    dev = os.stat("/").st_dev
    majmin = f"{os.major(dev)}:{os.minor(dev)}"
    try:
        uevent = Path(f"/sys/dev/block/{majmin}/uevent").read_text().splitlines()
        name = dict(line.split("=", 1) for line in uevent)["DEVNAME"]
    except (OSError, KeyError):
        pytest.skip(f"/ is not on a block device ({majmin}), e.g. an overlay in a container")
    return f"/dev/{name}", majmin


@pytest.mark.root
def test_the_root_device_is_refused():
    path, majmin = _root_device()
    try:
        target = inspect_target(path)
    except TargetError:
        # Containers may deny opening the device; the safety check needs only path and dev.
        target = Target(path, "block", size=0, logical_block_size=512, physical_block_size=512, dev=majmin)
    assert target.dev == majmin
    assert "root filesystem of the running system" in refusal(target)
