"""Targets: what a device or file path is (block device or regular file), and the checks that
stop a replay or a capture recipe from writing over data in use.
"""
import errno
import fcntl
import os
import shutil
import stat
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from traces.errors import TargetError, UnsafeTargetError

# <linux/fs.h>: _IOR(0x12, 114, size_t), _IO(0x12, 104), _IO(0x12, 123).
BLKGETSIZE64 = 0x80081272
BLKSSZGET = 0x1268
BLKPBSZGET = 0x127B

# O_DIRECT on a regular file must be aligned to the logical block size of the device under
# the filesystem, which Python cannot query portably (statx STATX_DIOALIGN is Linux 6.1+
# and not exposed). 4096 satisfies every 512-byte and 4Kn device, so files use it.
FILE_BLOCK_SIZE = 4096

_SYSFS = Path("/sys/dev/block")
_WHAT_TO_PASS = "pass a block device such as /dev/sdb or a regular file"


@dataclass(frozen=True)
class Target:
    """A replay target, measured once. `dev` is "MAJ:MIN" for block devices, else None."""

    path: str
    kind: str  # "block" or "file"
    size: int  # bytes
    logical_block_size: int  # bytes; offsets and lengths are aligned to this
    physical_block_size: int  # bytes; for files, the filesystem's preferred I/O size
    model: str | None = None
    rotational: bool | None = None
    dev: str | None = None
    backing_file: str | None = None  # loop devices only
    # A block device whose driver runs each I/O on the CPU that submits it (zram, brd, pmem):
    # it takes bios directly (no blk-mq), is not device-mapper or md, and sits on no other
    # device. io_uring cannot issue such I/O without blocking, so it would hand every one to
    # a kernel worker thread; unless an engine is asked for, the runner uses psync instead.
    sync_driver: bool = False


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _sysfs(dev: str) -> Path | None:
    """The sysfs directory of a block device, e.g. /sys/devices/.../block/sda/sda1."""
    path = _SYSFS / dev
    return path.resolve() if path.exists() else None


def _disk_of(node: Path) -> Path:
    """The whole-disk sysfs directory of a disk or partition directory."""
    return node.parent if (node / "partition").exists() else node


def _dev_of(st: os.stat_result) -> str:
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def inspect_target(path: str) -> Target:
    """Measure a block device or regular file; anything else raises `TargetError`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise TargetError(f"{path} does not exist; {_WHAT_TO_PASS}") from None
    except OSError as exc:
        raise TargetError(f"cannot look at {path}: {exc.strerror}; {_WHAT_TO_PASS}") from None

    if stat.S_ISREG(st.st_mode):
        node = _sysfs(f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
        rotational = _read(_disk_of(node) / "queue/rotational") if node else None
        return Target(
            path=os.path.abspath(path),
            kind="file",
            size=st.st_size,
            logical_block_size=FILE_BLOCK_SIZE,
            physical_block_size=st.st_blksize,
            rotational=None if rotational is None else rotational == "1",
        )
    if not stat.S_ISBLK(st.st_mode):
        what = (
            "a directory" if stat.S_ISDIR(st.st_mode)
            else "a character device, not a block device" if stat.S_ISCHR(st.st_mode)
            else "neither a block device nor a regular file"
        )
        raise TargetError(f"{path} is {what}; {_WHAT_TO_PASS}")

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise TargetError(
            f"cannot open {path}: {exc.strerror}; run as root "
            "(in a container, one that is allowed the device)"
        ) from None
    try:
        (size,) = struct.unpack("Q", fcntl.ioctl(fd, BLKGETSIZE64, bytes(8)))
        (logical,) = struct.unpack("i", fcntl.ioctl(fd, BLKSSZGET, bytes(4)))
        (physical,) = struct.unpack("I", fcntl.ioctl(fd, BLKPBSZGET, bytes(4)))
    finally:
        os.close(fd)

    dev = _dev_of(st)
    node = _sysfs(dev)
    model = rotational = backing = None
    sync_driver = False
    if node is not None:
        disk = _disk_of(node)
        backing = _read(disk / "loop/backing_file")
        model = _read(disk / "device/model") or (os.path.basename(backing) if backing else None)
        rotational = _read(disk / "queue/rotational")
        stacked = any((disk / "slaves").glob("*"))
        sync_driver = not stacked and not any((disk / sub).exists() for sub in ("mq", "dm", "md"))
    return Target(
        path=os.path.realpath(path),
        kind="block",
        size=size,
        logical_block_size=logical,
        physical_block_size=physical,
        model=model,
        rotational=None if rotational is None else rotational == "1",
        dev=dev,
        backing_file=backing,
        sync_driver=sync_driver,
    )


# Fallback signatures when blkid is missing: (offset, magic, what). Swap is checked at
# the 4 KiB page size, the only one on x86-64 and the usual one on arm64.
_MAGIC = (
    (0, b"XFSB", "an XFS filesystem"),
    (0, b"LUKS\xba\xbe", "a LUKS header"),
    (510, b"\x55\xaa", "an MBR partition table or boot sector"),
    (512, b"EFI PART", "a GPT partition table"),
    (512, b"LABELONE", "an LVM physical volume label"),
    (1080, b"\x53\xef", "an ext2/3/4 filesystem"),
    (4086, b"SWAPSPACE2", "a swap area"),
    (4086, b"SWAP-SPACE", "a swap area"),
    (65600, b"_BHRfS_M", "a btrfs filesystem"),
)
_MAGIC_BYTES = 68 * 1024


def _signatures(path: str) -> list[str]:
    """What is written on the device, by blkid's low-level probe or by the magic table."""
    blkid = shutil.which("blkid")
    if blkid:
        run = subprocess.run([blkid, "-p", "-o", "export", path], capture_output=True, text=True)
        if run.returncode == 0:
            found = dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line)
            if "PTTYPE" in found:
                return [f"a {found['PTTYPE']} partition table (blkid)"]
            if "TYPE" in found:
                return [f"a {found['TYPE']} signature (blkid)"]
        elif run.returncode == 8:  # ambivalent: several signatures
            return ["several signatures (blkid; see wipefs)"]
    try:
        with open(path, "rb") as f:
            head = f.read(_MAGIC_BYTES)
    except OSError:  # unreadable means unwritable too: the replay's own open will say why
        return []
    return [
        f"{what} (magic at byte {at})"
        for at, magic, what in _MAGIC
        if head[at : at + len(magic)] == magic
    ]


def _root_devs() -> set[str]:
    """MAJ:MIN of the device holding / and of the whole disk it is on."""
    dev = os.stat("/").st_dev
    devs = {f"{os.major(dev)}:{os.minor(dev)}"}
    if os.major(dev) == 0:  # overlay, btrfs subvolumes: use the mount's source instead
        for line in _lines("/proc/self/mountinfo"):
            left, _, right = line.partition(" - ")
            if left.split()[4] == "/" and right.split()[1].startswith("/dev/"):
                try:
                    devs = {_dev_of(os.stat(right.split()[1]))}
                except OSError:
                    pass
    for d in list(devs):
        node = _sysfs(d)
        if node is not None:
            devs.add(_read(_disk_of(node) / "dev") or d)
    return devs


def _lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def unclaimed(path: str, wait_s: float = 1.0) -> bool:
    """Whether block device `path` opens exclusively (O_EXCL), waiting up to `wait_s` for a
    claim to go: a replay that just ended on it, in this process or another, may hold one a
    few ms longer, as the kernel releases io_uring's registered files asynchronously."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC))
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise TargetError(f"cannot open {path}: {exc.strerror}; run as root") from None
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def _same(a: str, b: str) -> bool:
    """Whether paths `a` and `b` name the same file, or nodes of the same block device."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:  # gone, or in another mount namespace
        return False
    if stat.S_ISBLK(sa.st_mode) and stat.S_ISBLK(sb.st_mode):
        return sa.st_rdev == sb.st_rdev
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def loops_backed_by(path: str) -> list[str]:
    """The loop devices (/dev/loopN) whose backing file is `path`: a regular file, or a block
    device (`losetup B A` stacks B on A; sysfs lists no holder for it, and no claim is taken)."""
    return [f"/dev/{entry.parent.parent.name}"
            for entry in sorted(Path("/sys/block").glob("loop*/loop/backing_file"))
            if _same((_read(entry) or "").removesuffix(" (deleted)") or "/nonexistent", path)]


def _loop_reasons(path: str) -> tuple[list[str], list[str]]:
    """The loop devices stacked on the file or block device `path`: (those in use, each with
    how: mounted, claimed, stacked on in turn; those idle)."""
    busy, idle = [], []
    for loop in loops_backed_by(path):
        try:
            in_use = [r.removeprefix("it ") for r in _block_reasons(inspect_target(loop), signatures=False)
                      if not r.startswith("it has partitions") and not r.startswith("it backs the loop")]
        except TargetError:
            in_use = []
        if in_use:
            busy.append(f"it backs {loop}, which {' and '.join(in_use)}")
        else:
            idle.append(f"it backs the loop device {loop}")
    return busy, idle


def check_safe_to_write(target: Target, destroy_data: bool) -> None:
    """Raise `UnsafeTargetError` if writing to the block device or file would destroy data in
    use. `destroy_data` skips every check but one: a loop device stacked on the target that is
    mounted or claimed. The kernel refuses an exclusive open of a block device that is itself
    in use, but nothing stops a write through the file or device under a loop device."""
    if target.kind not in ("file", "block"):
        return
    busy = []
    for path in [target.path, *(_partitions(target) if target.kind == "block" else {}).values()]:
        busy += _loop_reasons(path)[0]
    if busy:
        raise UnsafeTargetError(
            f"refusing to write to {target.path} because {'; '.join(busy)}. Unmount it and "
            "detach the loop device (losetup -d) first, or pass --read-only to replay only the reads."
        )
    if destroy_data:
        return
    if target.kind == "file":
        reasons = _loop_reasons(target.path)[1] + [f"it carries {s}" for s in _signatures(target.path)]
    else:
        reasons = _block_reasons(target)
    if reasons:
        raise UnsafeTargetError(
            f"refusing to write to {target.path} because {'; '.join(reasons)}. "
            "Pass --destroy-data to write anyway, destroying its contents, "
            "or --read-only to replay only the reads."
        )


def _partitions(target: Target) -> dict[str, str]:
    """MAJ:MIN -> /dev/NAME of the partitions of the block device `target`."""
    node = _sysfs(target.dev)
    parts = sorted(p for p in node.iterdir() if (p / "partition").exists()) if node else []
    return {_read(p / "dev"): f"/dev/{p.name}" for p in parts}


def _block_reasons(target: Target, signatures: bool = True) -> list[str]:
    """Why writing to the block device `target` would destroy data in use."""
    node = _sysfs(target.dev)
    parts = sorted(p for p in node.iterdir() if (p / "partition").exists()) if node else []
    devs = {target.dev: target.path, **_partitions(target)}
    paths = set(devs.values())

    reasons = []
    mounted = set()
    for line in _lines("/proc/self/mountinfo"):
        fields = line.split()
        if fields[2] in devs:
            mounted.add(f"{devs[fields[2]]} on {fields[4]}")
    for line in _lines("/proc/mounts"):
        source, where = line.split()[:2]
        if source.startswith("/") and os.path.realpath(source) in paths:
            mounted.add(f"{os.path.realpath(source)} on {where}")
    if mounted:
        reasons.append("it is mounted (" + ", ".join(sorted(mounted)) + ")")
    swaps = [line.split()[0] for line in _lines("/proc/swaps")[1:]]
    if any(os.path.realpath(s) in paths for s in swaps):
        reasons.append("it is used as swap")
    if target.dev in _root_devs():
        reasons.append("it holds the root filesystem of the running system")
    holders = sorted(
        h.name
        for d in [node, *parts]
        if d is not None and (d / "holders").is_dir()
        for h in (d / "holders").iterdir()
    )
    if holders:
        reasons.append(f"it is held by {', '.join(holders)} (LVM, device-mapper or RAID)")
    for path in paths:  # loop devices stacked on it, which sysfs does not list as holders
        reasons.extend(sum(_loop_reasons(path), []))
    if parts:
        reasons.append(f"it has partitions ({', '.join(p.name for p in parts)})")
    if signatures:
        reasons.extend(f"it carries {s}" for s in _signatures(target.path))
    if not reasons and not unclaimed(target.path, wait_s=1.0 if signatures else 0.0):
        reasons.append("it is in use (the kernel refused an exclusive open with EBUSY)")
    return reasons
