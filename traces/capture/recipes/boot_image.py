"""The `boot` recipe's guest: a minimal Debian image built with debootstrap, cached outside the tree.

One build (a few minutes, Debian's mirror) gives an ext4 image plus the guest's kernel and
initrd; later runs reuse them. The guest boots to multi-user.target and powers itself off.
"""
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from traces.capture.recipes.common import mounts_under
from traces.errors import ReplayError

DEFAULT_CACHE_DIR = Path("/var/cache/tracereplay")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# What the guest holds beyond debootstrap's minbase: a kernel (its initramfs is made at
# install), systemd as init, udev for /dev/vda's links, e2fsprogs for the root fsck.
PACKAGES = ("linux-image-amd64", "initramfs-tools", "systemd-sysv", "udev", "kmod", "e2fsprogs")
# Printed on the serial console by the guest once multi-user.target is active.
MARKER = "tracereplay-boot: multi-user.target reached, powering off"
# The guest's unit: ordered after multi-user.target, so it runs once the boot is complete.
POWEROFF_UNIT = f"""\
[Unit]
Description=tracereplay: power off once multi-user.target is reached
After=multi-user.target

[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo "{MARKER}" > /dev/ttyS0'
ExecStart=/bin/systemctl --no-block poweroff

[Install]
WantedBy=multi-user.target
"""
FSTAB = "/dev/vda / ext4 errors=remount-ro 0 1\n"
# Inode tables and journal are zeroed here, not by the guest's ext4lazyinit thread, whose
# background writes during the boot would be no part of a real boot.
MKFS_OPTIONS = ("-E", "lazy_itable_init=0,lazy_journal_init=0", "-L", "tracereplay-boot")
# Bump when the image would differ for the same knobs: the cache key includes it.
BUILD_VERSION = 1


class ImageBuildError(ReplayError):
    """The guest image cannot be built (no debootstrap, mirror unreachable, not root)."""


@dataclass(frozen=True)
class BootImage:
    image: Path        # ext4 filesystem image, the guest's whole /dev/vda
    kernel: Path       # the guest's vmlinuz
    initrd: Path       # its initramfs
    suite: str         # Debian suite, e.g. "bookworm"
    kernel_version: str  # the guest kernel's release, e.g. "6.1.0-28-amd64"
    size: int          # bytes of the image
    filesystem: str    # "ext4"
    built: bool        # True when this call built it, False when it came from the cache


def host_suite() -> str:
    """The host's Debian codename (the guest's default suite), or bookworm off Debian."""
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return "bookworm"
    found = re.search(r"^VERSION_CODENAME=\"?([a-z]+)\"?$", text, re.M)
    if found and "ID=debian" in text:
        return found.group(1)
    return "bookworm"


def cache_key(suite: str) -> str:
    """Hash of everything that shapes the image, so a change of recipe gives a new file."""
    recipe = json.dumps({"suite": suite, "arch": platform.machine(), "packages": PACKAGES,
                         "unit": POWEROFF_UNIT, "fstab": FSTAB, "mkfs": MKFS_OPTIONS,
                         "version": BUILD_VERSION}, sort_keys=True)
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def _paths(cache_dir: Path, suite: str) -> dict:
    stem = f"boot-{suite}-{cache_key(suite)}"
    return {k: cache_dir / f"{stem}.{k}" for k in ("img", "vmlinuz", "initrd", "json", "lock")}


def _cached(paths: dict) -> BootImage | None:
    """The cached build, if complete: its JSON is written last, so its presence commits it."""
    try:
        facts = json.loads(paths["json"].read_text())
    except (OSError, ValueError):
        return None
    if not all(paths[k].is_file() for k in ("img", "vmlinuz", "initrd")):
        return None
    return BootImage(paths["img"], paths["vmlinuz"], paths["initrd"], facts["suite"],
                     facts["kernel_version"], paths["img"].stat().st_size, facts["filesystem"], False)


def _run(args: list, what: str, log: Path | None = None) -> None:
    """Run a build step; on failure raise with the tail of its output and what to do next."""
    try:
        if log is not None:
            with open(log, "ab") as out:
                proc = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            tail = log.read_text(errors="replace").splitlines()[-15:] if proc.returncode else []
        else:
            proc = subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL)
            tail = (proc.stdout + proc.stderr).splitlines()[-15:]
    except OSError as exc:
        raise ImageBuildError(f"cannot run {args[0]} to {what}: {exc.strerror}") from None
    if proc.returncode:
        where = f" (full log: {log})" if log is not None else ""
        raise ImageBuildError(f"{args[0]} failed to {what} (exit status {proc.returncode}){where}:\n  "
                              + "\n  ".join(tail))


def _configure(root: Path) -> None:
    """Make the debootstrapped tree boot as /dev/vda to multi-user.target and power off."""
    (root / "etc/fstab").write_text(FSTAB)
    (root / "etc/hostname").write_text("tracereplay-boot\n")
    unit = root / "etc/systemd/system/tracereplay-poweroff.service"
    unit.write_text(POWEROFF_UNIT)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / unit.name).symlink_to("/etc/systemd/system/tracereplay-poweroff.service")
    default = root / "etc/systemd/system/default.target"
    default.unlink(missing_ok=True)
    default.symlink_to("/lib/systemd/system/multi-user.target")
    # No machine-id: each boot makes one, as a first boot of a fresh install does.
    (root / "etc/machine-id").write_text("")
    # The apt lists and package cache are no part of a booting system.
    shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    for lists in (root / "var/lib/apt/lists").glob("*_Packages"):
        lists.unlink()


def _kernel_files(root: Path) -> tuple[Path, Path, str]:
    kernels = sorted((root / "boot").glob("vmlinuz-*"))
    if not kernels:
        raise ImageBuildError(f"the debootstrapped tree has no kernel in {root / 'boot'}; "
                              "did linux-image-amd64 install?")
    version = kernels[-1].name.removeprefix("vmlinuz-")
    initrd = root / "boot" / f"initrd.img-{version}"
    if not initrd.is_file():
        raise ImageBuildError(f"the guest kernel {version} has no initramfs ({initrd}); "
                              "initramfs-tools did not run")
    return kernels[-1], initrd, version


def _tree_bytes(root: Path) -> int:
    out = subprocess.run(["du", "-s", "--block-size=1", "-x", str(root)], capture_output=True, text=True)
    return int(out.stdout.split()[0]) if out.returncode == 0 and out.stdout else 1 << 30


def build_image(cache_dir: Path = DEFAULT_CACHE_DIR, suite: str | None = None, *,
                mirror: str = DEFAULT_MIRROR, notices: list | None = None) -> BootImage:
    """The guest image for `suite` from `cache_dir`, building it there first if it is missing.

    Concurrent callers wait for one build (a lock file). Raises ImageBuildError when a
    tool is missing or a step fails; a failed build leaves nothing in the cache.
    """
    notices = [] if notices is None else notices
    suite = suite or host_suite()
    if not re.fullmatch(r"[a-z][a-z0-9-]*", suite):
        raise ImageBuildError(f"{suite!r} is not a Debian suite name; give one such as bookworm")
    if os.geteuid() != 0:
        raise ImageBuildError("building the boot image needs root (debootstrap, chroot); run it with sudo")
    for tool in ("debootstrap", "mkfs.ext4"):
        if shutil.which(tool) is None:
            package = "debootstrap" if tool == "debootstrap" else "e2fsprogs"
            raise ImageBuildError(f"{tool} is not installed; install it with: apt-get install {package}")
    cache_dir = Path(cache_dir)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ImageBuildError(f"{cache_dir}: cannot make the image cache ({exc.strerror}); "
                              "give another --cache-dir") from None
    paths = _paths(cache_dir, suite)
    found = _cached(paths)
    if found is not None:
        return found
    with open(paths["lock"], "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = _cached(paths)  # another process may have built it while we waited
        if found is not None:
            return found
        notices.append(f"building the {suite} guest image in {cache_dir} (debootstrap; a few minutes, once)")
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=cache_dir))
        try:
            return _build(work, paths, suite, mirror)
        finally:
            _remove_tree(work)


def _build(work: Path, paths: dict, suite: str, mirror: str) -> BootImage:
    root = work / "root"
    log = work / "debootstrap.log"
    _run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", suite, str(root), mirror],
         f"build a {suite} tree from {mirror} (is the mirror reachable?)", log)
    _configure(root)
    kernel, initrd, version = _kernel_files(root)
    # Room for the tree plus a quarter, at least 256 MiB free, in whole MiB.
    used = _tree_bytes(root)
    size = ((used + max(used // 4, 256 << 20)) >> 20) << 20
    image = work / "image.img"
    with open(image, "wb") as f:
        f.truncate(size)
    _run(["mkfs.ext4", "-q", "-F", *MKFS_OPTIONS, "-d", str(root), str(image)], "make the ext4 image")
    for src, key in ((kernel, "vmlinuz"), (initrd, "initrd")):
        shutil.copyfile(src, work / f"staged.{key}")
        os.replace(work / f"staged.{key}", paths[key])
    os.replace(image, paths["img"])
    facts = {"suite": suite, "kernel_version": version, "filesystem": "ext4", "mirror": mirror,
             "packages": list(PACKAGES), "image_bytes": size, "cache_key": cache_key(suite)}
    tmp = paths["json"].with_suffix(".json.tmp")
    tmp.write_text(json.dumps(facts, indent=1) + "\n")
    os.replace(tmp, paths["json"])
    found = _cached(paths)
    return BootImage(found.image, found.kernel, found.initrd, suite, version, size, "ext4", True)


def _remove_tree(work: Path) -> None:
    """Remove a build directory, after unmounting what debootstrap left mounted in it.

    rmtree would descend into a /proc, /sys or /dev left mounted by a failed debootstrap,
    so a directory that still holds a mount is left in place rather than removed.
    """
    for point in sorted(mounts_under(work), key=len, reverse=True):
        subprocess.run(["umount", point], capture_output=True)
    for point in mounts_under(work):
        subprocess.run(["umount", "--lazy", point], capture_output=True)
    if mounts_under(work):
        raise ImageBuildError(f"{work}: mounts remain inside the build directory; unmount them and remove it")
    shutil.rmtree(work, ignore_errors=True)
