"""Benchmark targets as context managers: a direct-I/O loop device over a file on the local
disk, and /dev/zram0. Both are pre-written over the test span (so reads hit real blocks) and
always torn down: the loop device detached, its file removed, zram0 reset.
"""
import contextlib
import os
import subprocess
import tempfile
from pathlib import Path

GIB = 1 << 30
MIB = 1 << 20
ZRAM = "/sys/block/zram0"


def _run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def prewrite(path: str, span: int, compress_pct: int = 0) -> None:
    """Write [0, span) of `path` sequentially in 1 MiB direct writes with fio's random data
    (`compress_pct` of each buffer zeros, so zram has something to compress)."""
    cmd = ["fio", "--name=prewrite", f"--filename={path}", "--rw=write", "--bs=1M",
           f"--size={span}", "--direct=1", "--ioengine=io_uring", "--iodepth=8",
           "--output-format=terse", "--refill_buffers"]
    if compress_pct:
        cmd.append(f"--buffer_compress_percentage={compress_pct}")
    subprocess.run(cmd, check=True, capture_output=True)


@contextlib.contextmanager
def loop_device(size: int = 2 * GIB, span: int = GIB, directory: str = "/var/tmp"):
    """A loop device with --direct-io=on over a sparse `size`-byte file in `directory` (on the
    local disk; not tmpfs, which refuses direct I/O to the backing file), written over `span`."""
    fd, backing = tempfile.mkstemp(prefix="tracereplay-bench-", suffix=".img", dir=directory)
    os.close(fd)
    dev = None
    try:
        os.truncate(backing, size)
        prewrite(backing, span)
        os.sync()
        dev = _run("losetup", "--find", "--show", "--direct-io=on", backing)
        yield dev
    finally:
        if dev:
            subprocess.run(["losetup", "-d", dev], check=False)
        Path(backing).unlink(missing_ok=True)


@contextlib.contextmanager
def zram_device(size: int = 2 * GIB, span: int = GIB, compress_pct: int = 50):
    """/dev/zram0 sized `size`, written over `span` with `compress_pct` % compressible data.
    Refuses a zram0 that is already set up (someone else's); resets it at the end."""
    disksize = Path(ZRAM, "disksize")
    if not disksize.exists():
        raise RuntimeError("/dev/zram0 does not exist: modprobe zram first")
    if int(disksize.read_text()) != 0:
        raise RuntimeError("/dev/zram0 is already initialised (in use?): reset it first with "
                           "`echo 1 > /sys/block/zram0/reset` if it is yours")
    try:
        disksize.write_text(str(size))
        prewrite("/dev/zram0", span, compress_pct)
        yield "/dev/zram0"
    finally:
        Path(ZRAM, "reset").write_text("1")


@contextlib.contextmanager
def target(kind: str, size: int = 2 * GIB, span: int = GIB):
    """`kind` is "loop" or "zram"."""
    make = {"loop": loop_device, "zram": zram_device}[kind]
    with make(size=size, span=span) as dev:
        yield dev
