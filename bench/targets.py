"""Benchmark targets as context managers: a direct-I/O loop device over a file on the local
disk, and /dev/zram0. Both are pre-written over the test span (so reads hit real blocks) and
always torn down: the loop device detached, its file removed, zram0 reset.
"""
import contextlib
import errno
import os
import subprocess
import tempfile
import time
from pathlib import Path

GIB = 1 << 30
MIB = 1 << 20
ZRAM = "/sys/block/zram0"
ZRAM_CONTROL = "/sys/class/zram-control"
BLKIO = Path("/sys/fs/cgroup/blkio")


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
def loop_device(size: int = 2 * GIB, span: int = GIB, directory: str = "/var/tmp",
                buffered_ok: bool = False):
    """A loop device with --direct-io=on over a sparse `size`-byte file in `directory` (on the
    local disk by default), written over `span`. With `buffered_ok`, a file system that
    refuses direct I/O to the backing file (tmpfs before Linux 6.6) gets buffered I/O."""
    fd, backing = tempfile.mkstemp(prefix="tracereplay-bench-", suffix=".img", dir=directory)
    os.close(fd)
    dev = None
    try:
        os.truncate(backing, size)
        prewrite(backing, span)
        os.sync()
        try:
            dev = _run("losetup", "--find", "--show", "--direct-io=on", backing)
        except subprocess.CalledProcessError:
            if not buffered_ok:
                raise
            dev = _run("losetup", "--find", "--show", backing)
        yield dev
    finally:
        if dev:
            subprocess.run(["losetup", "-d", dev], check=False)
        Path(backing).unlink(missing_ok=True)

@contextlib.contextmanager
def zram_device(size: int = 2 * GIB, span: int = GIB, compress_pct: int = 50):
    """A zram device sized `size`, written over `span` with `compress_pct` % compressible data:
    one added for the bench where the kernel can add them (/sys/class/zram-control), so the
    tests' /dev/zram0 stays free for a test suite running meanwhile, else /dev/zram0 (refused
    when already set up). Reset, and removed if added, at the end."""
    added = None
    if Path(ZRAM_CONTROL, "hot_add").exists():
        added = int(Path(ZRAM_CONTROL, "hot_add").read_text())
        sysfs = Path(f"/sys/block/zram{added}")
    else:
        sysfs = Path(ZRAM)
        if not sysfs.exists():
            raise RuntimeError("/dev/zram0 does not exist: modprobe zram first")
        if int(Path(sysfs, "disksize").read_text()) != 0:
            raise RuntimeError("/dev/zram0 is already initialised (in use?): reset it first with "
                               "`echo 1 > /sys/block/zram0/reset` if it is yours")
    try:
        Path(sysfs, "disksize").write_text(str(size))
        dev = f"/dev/{sysfs.name}"
        prewrite(dev, span, compress_pct)
        yield dev
    finally:
        reset_zram(sysfs=sysfs)
        if added is not None:
            Path(ZRAM_CONTROL, "hot_remove").write_text(str(added))


def reset_zram(tries: int = 50, sysfs=ZRAM) -> None:
    """Reset a zram device (/dev/zram0 by default), retrying while the kernel still holds it:
    it frees an io_uring ring (and the ring's hold on the device) some milliseconds after the
    last run."""
    for attempt in range(tries):
        try:
            Path(sysfs, "reset").write_text("1")
            return
        except OSError as e:
            if e.errno != errno.EBUSY or attempt == tries - 1:
                raise
            time.sleep(0.1)


@contextlib.contextmanager
def zram_or_shm(size: int = 2 * GIB, span: int = GIB):
    """A zram device as zram_device makes it (loading the zram module if it is missing), or,
    where there is no zram or only a zram0 that is someone else's, a loop device over /dev/shm.
    Yields (kind, device)."""
    if not Path(ZRAM).exists():
        with contextlib.suppress(OSError):  # no modprobe: the fallback below
            subprocess.run(["modprobe", "zram"], check=False, capture_output=True)
    zram0_free = Path(ZRAM, "disksize").exists() and int(Path(ZRAM, "disksize").read_text()) == 0
    if Path(ZRAM_CONTROL, "hot_add").exists() or zram0_free:
        with zram_device(size=size, span=span) as dev:
            yield "zram", dev
    else:
        with shm_loop_device(size=size, span=span) as dev:
            yield "shm loop", dev


@contextlib.contextmanager
def target(kind: str, size: int = 2 * GIB, span: int = GIB):
    """`kind` is "loop" or "zram"."""
    make = {"loop": loop_device, "zram": zram_device}[kind]
    with make(size=size, span=span) as dev:
        yield dev


# ---- two drives on one machine: a fast one in memory, a slow one throttled ------------------

SHM = "/dev/shm"


def shm_loop_device(size: int = 2 * GIB, span: int = GIB, directory: str = SHM):
    """The "fast drive": a loop device over a file in /dev/shm (memory), written over `span`.

    Direct I/O to the backing file where tmpfs accepts it (kernels >= 6.6), buffered otherwise;
    either way every block it serves is in RAM, so only the loop driver's cost is left.
    """
    return loop_device(size, span, directory, buffered_ok=True)


def _cgroup_mounts() -> tuple[str | None, str | None]:
    """(cgroup v2 mount where the io controller is available, cgroup v1 blkio mount): either
    may be None. On hybrid hosts the io controller lives in exactly one of the two."""
    v2 = v1 = None
    for line in Path("/proc/mounts").read_text().splitlines():
        _, where, fstype, opts, *_ = line.split()
        if fstype == "cgroup2":
            controllers = Path(where, "cgroup.controllers")
            if controllers.exists() and "io" in controllers.read_text().split():
                v2 = where
        elif fstype == "cgroup" and "blkio" in opts.split(","):
            v1 = where
    return v2, v1


def _maj_min(device: str) -> str:
    st = os.stat(device)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


class Throttle:
    """A private block cgroup that limits one device for the processes that join it.

    `kind` says which interface does the limiting: "io.max" (cgroup v2) or "blkio.throttle"
    (cgroup v1, on hybrid hosts where blkio is still bound to v1). `limits` is what was set.
    """

    def __init__(self, path: Path, kind: str, device: str, limits: dict):
        self.path, self.kind, self.device, self.limits = path, kind, device, limits

    def join(self, pid: int = 0) -> None:
        """Move process `pid` (0: the calling one), with all its threads, into the group.
        Join before the process opens its io_uring: io-wq workers are made in the cgroup of the
        task that makes them, and the throttle charges the task that submits the bio."""
        Path(self.path, "cgroup.procs").write_text(str(pid or os.getpid()))

    def popen_kwargs(self) -> dict:
        """Keyword arguments for subprocess.run/Popen that start the child inside the group."""
        procs = str(Path(self.path, "cgroup.procs"))

        def enter():
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        return {"preexec_fn": enter}

    def run(self, cmd, **kwargs) -> subprocess.CompletedProcess:
        """subprocess.run(cmd) with the child inside the group from its first instruction."""
        return subprocess.run(cmd, **kwargs, **self.popen_kwargs())

    def serviced(self) -> dict:
        """I/Os the group has had serviced on the device, from the controller's own counters:
        {"read": n, "write": n}, or {} where the kernel does not count them."""
        if self.kind == "io.max":
            for line in Path(self.path, "io.stat").read_text().splitlines():
                dev, *pairs = line.split()
                if dev == _maj_min(self.device):
                    kv = dict(p.split("=") for p in pairs)
                    return {"read": int(kv.get("rios", 0)), "write": int(kv.get("wios", 0))}
            return {}
        out = {}
        for line in Path(self.path, "blkio.throttle.io_serviced").read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == _maj_min(self.device) and parts[1] in ("Read", "Write"):
                out[parts[1].lower()] = int(parts[2])
        return out


@contextlib.contextmanager
def throttle_group(device: str, *, riops: int | None = None, wiops: int | None = None,
                   rbps: int | None = None, wbps: int | None = None):
    """A private cgroup that throttles `device` to the given IOPS and bytes/s (None: no limit).

    cgroup v2's io.max where the io controller is on the v2 hierarchy, else cgroup v1's
    blkio.throttle.*_device files. Processes join with Throttle.join / popen_kwargs. At the
    end, any process still inside is moved back to the hierarchy's root and the group removed.
    """
    if os.geteuid() != 0:
        raise RuntimeError("throttling a device needs root (it writes to the cgroup filesystem)")
    v2, v1 = _cgroup_mounts()
    limits = {k: v for k, v in dict(riops=riops, wiops=wiops, rbps=rbps, wbps=wbps).items() if v}
    majmin = _maj_min(device)
    if v2:
        root, kind = Path(v2), "io.max"
    elif v1:
        root, kind = Path(v1), "blkio.throttle"
    else:
        raise RuntimeError("no block cgroup controller is mounted (neither cgroup v2's io nor "
                           "cgroup v1's blkio); mount one to make a throttled drive")
    group = root / f"tracereplay-throttle-{os.getpid()}-{majmin.replace(':', '-')}"
    group.mkdir()
    try:
        if kind == "io.max":
            control = root / "cgroup.subtree_control"
            if "io" not in control.read_text().split():
                control.write_text("+io")
            spec = " ".join(f"{k}={v}" for k, v in limits.items())
            Path(group, "io.max").write_text(f"{majmin} {spec}")
        else:
            files = {"riops": "read_iops_device", "wiops": "write_iops_device",
                     "rbps": "read_bps_device", "wbps": "write_bps_device"}
            for key, value in limits.items():
                Path(group, f"blkio.throttle.{files[key]}").write_text(f"{majmin} {value}")
        yield Throttle(group, kind, device, limits)
    finally:
        for pid in Path(group, "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # it may have exited meanwhile
                Path(root, "cgroup.procs").write_text(pid)
        group.rmdir()


@contextlib.contextmanager
def slow_loop_device(size: int = 2 * GIB, span: int = GIB, *, riops: int = 2000,
                     wiops: int = 2000, rbps: int | None = 64 * MIB, wbps: int | None = 64 * MIB,
                     directory: str = "/var/tmp"):
    """The "slow drive": a direct-I/O loop device over a file on the local disk, throttled by
    a private block cgroup. Yields (device, Throttle): only processes that join the Throttle
    are limited."""
    with loop_device(size=size, span=span, directory=directory) as dev, \
            throttle_group(dev, riops=riops, wiops=wiops, rbps=rbps, wbps=wbps) as throttle:
        yield dev, throttle


@contextlib.contextmanager
def drive_pair(size: int = 512 * MIB, span: int | None = None, **slow_limits):
    """Two targets of equal size that behave like different drives: yields (fast, slow,
    throttle) where fast is a loop device over /dev/shm and slow a throttled loop device over
    the local disk (`slow_limits` as for slow_loop_device)."""
    span = size if span is None else span
    with shm_loop_device(size=size, span=span) as fast, \
            slow_loop_device(size=size, span=span, **slow_limits) as (slow, throttle):
        yield fast, slow, throttle


@contextlib.contextmanager
def root_throttle(device: str, riops: int, wiops: int, bps: int):
    """Limit every I/O to `device` in the root blkio cgroup (v1), and lift the limits after."""
    if not (BLKIO / "blkio.throttle.read_iops_device").exists():
        raise SystemExit("this needs cgroup v1's blkio controller (root-level throttling "
                         "of a device, the kernel's writeback included); it is not mounted here")
    st = os.stat(device)
    majmin = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    limits = {"read_iops": riops, "write_iops": wiops, "read_bps": bps, "write_bps": bps}
    try:
        for key, value in limits.items():
            (BLKIO / f"blkio.throttle.{key}_device").write_text(f"{majmin} {value}")
        yield limits
    finally:
        for key in limits:
            with contextlib.suppress(OSError):
                (BLKIO / f"blkio.throttle.{key}_device").write_text(f"{majmin} 0")


@contextlib.contextmanager
def stacked_loop(lower: str):
    """A direct-I/O loop device over the block device `lower`, detached at the end."""
    dev = subprocess.run(["losetup", "--find", "--show", "--direct-io=on", lower], check=True,
                         capture_output=True, text=True).stdout.strip()
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)
