"""Write safety for file targets and the results path: a disk image in use, or holding a
filesystem, is refused as a block device would be, and the results never replace the target,
the image behind it or the trace. Real loop devices, real mkfs and mount."""
import hashlib
import shutil
import subprocess

import numpy as np
import pytest

from replay.runner import RunOptions, replay
from traces.errors import ReplayError, TargetError, UnsafeTargetError
from traces.schema import Op
from traces.trace import read_trace, write_trace

MIB = 1 << 20
R, W = Op.READ, Op.WRITE
needs_mkfs = pytest.mark.skipif(shutil.which("mkfs.ext4") is None, reason="needs mkfs.ext4")


def _trace(path, rows=((0, W, 1 * MIB, 4096), (10_000, R, 0, 4096))):
    ts, op, offset, length = (np.array(c) for c in zip(*rows))
    write_trace(path, {"ts_ns": ts.astype(np.int64), "op": op.astype(np.uint8),
                       "offset": offset.astype(np.int64), "length": length.astype(np.int64)},
                {"name": path.stem})
    return path


def _digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _ext4_image(path, size=8 * MIB):
    with open(path, "wb") as f:
        f.truncate(size)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(path)], check=True, capture_output=True)
    return path


@pytest.mark.root
@pytest.mark.loopdev
@needs_mkfs
@pytest.mark.parametrize("options", [{}, {"destroy_data": True}], ids=["plain", "destroy-data"])
def test_the_image_of_a_mounted_loop_device_is_refused(tmp_path, options):
    # A run once overwrote a mounted ext4 this way: the image is a regular file, and file
    # targets were never checked. Nothing in the kernel stops a write through the file, so
    # even --destroy-data is refused while the loop device is mounted.
    image = _ext4_image(tmp_path / "disk.img")
    where = tmp_path / "mnt"
    where.mkdir()
    loop = None
    mounted = False
    try:
        loop = subprocess.run(["losetup", "--find", "--show", str(image)], check=True,
                              capture_output=True, text=True).stdout.strip()
        subprocess.run(["mount", loop, str(where)], check=True, capture_output=True)
        mounted = True
        (where / "precious").write_text("data in use")
        subprocess.run(["sync"], check=True)
        before = _digest(image)
        with pytest.raises(UnsafeTargetError) as err:
            replay(_trace(tmp_path / "w.parquet"), str(image), RunOptions(engine="psync", **options),
                   output=tmp_path / "out.parquet")
        message = str(err.value)
        assert f"it backs {loop}, which is mounted ({loop} on {where})" in message
        assert "losetup -d" in message
        assert _digest(image) == before
        assert not (tmp_path / "out.parquet").exists()
    finally:
        if mounted:
            subprocess.run(["umount", str(where)], capture_output=True)
        if loop:
            subprocess.run(["losetup", "--detach", loop], capture_output=True)


@pytest.mark.root
@pytest.mark.loopdev
def test_the_image_of_an_unmounted_loop_device_is_refused_without_destroy_data(tmp_path, loop_device):
    loop_device(4 * MIB)
    image = tmp_path / "disk0.img"  # the fixture's backing file
    trace = _trace(tmp_path / "w.parquet")
    with pytest.raises(UnsafeTargetError, match=r"it backs the loop device /dev/loop\d+.*--destroy-data"):
        replay(trace, str(image), RunOptions(engine="psync"), output=tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()
    replay(trace, str(image), RunOptions(engine="psync", destroy_data=True), output=tmp_path / "out.parquet")
    cols, _ = read_trace(tmp_path / "out.parquet")
    np.testing.assert_array_equal(cols["result"], 4096)


@needs_mkfs
def test_a_file_holding_a_filesystem_is_refused_but_read_only_and_destroy_data_go(tmp_path):
    image = _ext4_image(tmp_path / "fs.img")
    trace = _trace(tmp_path / "w.parquet")
    before = _digest(image)
    with pytest.raises(UnsafeTargetError, match=r"it carries a ext4 signature \(blkid\).*--destroy-data"):
        replay(trace, str(image), RunOptions(engine="psync"), output=tmp_path / "out.parquet")
    assert _digest(image) == before and not (tmp_path / "out.parquet").exists()
    replay(trace, str(image), RunOptions(engine="psync", read_only=True), output=tmp_path / "ro.parquet")
    assert _digest(image) == before
    replay(trace, str(image), RunOptions(engine="psync", destroy_data=True), output=tmp_path / "dd.parquet")
    assert _digest(image) != before


@pytest.mark.skipif(shutil.which("sfdisk") is None, reason="needs sfdisk")
def test_a_file_holding_a_partition_table_is_refused(tmp_path):
    image = tmp_path / "disk.img"
    with open(image, "wb") as f:
        f.truncate(8 * MIB)
    subprocess.run(["sfdisk", "--no-reread", "--no-tell-kernel", str(image)], input="label: gpt\n",
                   check=True, capture_output=True, text=True)
    with pytest.raises(UnsafeTargetError, match="gpt partition table"):
        replay(_trace(tmp_path / "w.parquet"), str(image), RunOptions(engine="psync"),
               output=tmp_path / "out.parquet")


def test_a_blank_file_is_written_without_question(tmp_path):
    image = tmp_path / "blank.img"
    with open(image, "wb") as f:
        f.truncate(4 * MIB)
    outcome = replay(_trace(tmp_path / "w.parquet"), str(image), RunOptions(engine="psync"),
                     output=tmp_path / "out.parquet")
    assert outcome.rows == 2


@pytest.mark.parametrize("read_only", [False, True], ids=["writes", "read-only"])
def test_the_results_path_is_never_the_target(tmp_path, read_only):
    image = tmp_path / "disk.img"
    with open(image, "wb") as f:
        f.truncate(4 * MIB)
    before = _digest(image)
    with pytest.raises(TargetError, match=r"is the target .*would replace it; choose another -o"):
        replay(_trace(tmp_path / "w.parquet"), str(image), RunOptions(engine="psync", read_only=read_only,
                                                                    destroy_data=True), output=image)
    assert _digest(image) == before and image.stat().st_size == 4 * MIB


@pytest.mark.root
@pytest.mark.loopdev
def test_the_results_path_is_never_the_image_behind_a_loop_target(tmp_path, loop_device):
    device = loop_device(4 * MIB)
    image = tmp_path / "disk0.img"
    with pytest.raises(TargetError, match=r"is the file behind the target .*choose another -o"):
        replay(_trace(tmp_path / "r.parquet", [(0, R, 0, 4096)]), device, RunOptions(), output=image)
    assert image.stat().st_size == 4 * MIB


def test_the_results_path_is_never_the_trace(tmp_path):
    trace = _trace(tmp_path / "w.parquet")
    before = _digest(trace)
    with pytest.raises(ReplayError, match="is the trace being replayed"):
        replay(trace, None, RunOptions(engine="null"), output=trace)
    assert _digest(trace) == before


@pytest.mark.parametrize("where, problem", [("missing/out.parquet", "does not exist"),
                                            ("adir", "is a directory")])
def test_an_output_that_cannot_be_written_is_refused_before_the_run(tmp_path, where, problem):
    (tmp_path / "adir").mkdir()
    image = tmp_path / "disk.img"
    with open(image, "wb") as f:
        f.write(b"\x5a" * MIB)
    before = _digest(image)
    with pytest.raises(TargetError, match=problem):
        replay(_trace(tmp_path / "w.parquet"), str(image), RunOptions(engine="psync"),
               output=tmp_path / where)
    assert _digest(image) == before  # refused before any I/O
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "disk.img", "w.parquet"]
    assert list((tmp_path / "adir").iterdir()) == []
