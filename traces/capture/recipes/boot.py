"""The `boot` recipe: a minimal Debian guest booted with qemu from DEVICE, traced until it powers off.

The image (boot_image.py) is built once and cached; each run writes it to DEVICE, then
captures only the boot: kernel, initramfs, systemd to multi-user.target, and poweroff.
"""
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

from traces.capture.recipes import boot_image
from traces.capture.recipes.common import MIB, RecipeError, Session, parse_knobs, require, version_of

DESCRIPTION = ("An OS boot: a minimal Debian image (debootstrap, systemd) booted with qemu from "
               "DEVICE to multi-user.target, then powered off.")
ACCELERATORS = ("tcg", "kvm")
KNOBS = {
    "suite": (str, boot_image.host_suite(), "Debian suite of the guest (default: the host's)."),
    "timeout": (float, 300.0, "Seconds the boot may take; qemu is then ended and the trace says the "
                              "boot did not finish."),
    "memory": (int, 1024, "Guest memory in MiB."),
    "accel": (str, "tcg", "qemu accelerator: tcg (software emulation, which stretches the gaps "
                          "between I/Os) or kvm (hangs a stock Debian kernel on some hosts)."),
    "cache_dir": (str, str(boot_image.DEFAULT_CACHE_DIR), "Directory that keeps the built image, "
                  "kernel and initrd between runs."),
    "mirror": (str, boot_image.DEFAULT_MIRROR, "Debian mirror debootstrap builds the image from."),
}
QEMU = "qemu-system-x86_64"
# The guest kernel's line on a clean poweroff (kernel/reboot.c).
_POWER_DOWN = "reboot: Power down"


def qemu_command(image: boot_image.BootImage, device: str, serial_log: Path, *, memory: int,
                 accel: str) -> list[str]:
    """The qemu invocation: the guest's kernel and initrd, DEVICE as its virtio disk, O_DIRECT."""
    return [QEMU, "-accel", accel, "-m", f"{memory}M", "-nographic", "-monitor", "none",
            "-serial", f"file:{serial_log}", "-nic", "none", "-no-reboot",
            "-kernel", str(image.kernel), "-initrd", str(image.initrd),
            # panic=-1 with -no-reboot: a guest panic ends qemu at once instead of hanging.
            "-append", "root=/dev/vda ro console=ttyS0 panic=-1",
            "-drive", f"file={device},format=raw,if=virtio,cache=none"]


def _write_image(image: Path, device: str, *, sparse: bool) -> None:
    """Copy the image onto DEVICE with O_DIRECT; a fresh scratch device skips zero blocks."""
    args = ["dd", f"if={image}", f"of={device}", "bs=4M", "oflag=direct", "conv=fsync,notrunc"]
    if sparse:
        args[-1] += ",sparse"
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode:
        raise RecipeError(f"cannot write the guest image to {device}: {done.stderr.strip()}")


def _serial_tail(log: Path, lines: int = 8) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no serial output)"
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "")
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept) or "(no serial output)"


def run(device: str | None, output: Path, *, notices: list, destroy_data: bool = False,
        backend: str = "auto", on_start=None, **knobs):
    """Build (or reuse) the guest image, write it to DEVICE, and capture its boot into `output`.

    A boot that does not power off within the timeout is ended (qemu, by its pid) and still
    written, its metadata saying it did not finish; a notice says so too. Returns the
    CaptureResult. Raises RecipeError when qemu or the image cannot be had, or DEVICE is
    unsafe to overwrite without destroy_data. `on_start(backend)` is called once tracing runs.
    """
    knobs = parse_knobs(KNOBS, knobs)
    if knobs["accel"] not in ACCELERATORS:
        raise RecipeError(f"knob accel: {knobs['accel']!r} is not one of {', '.join(ACCELERATORS)}")
    require({QEMU: "qemu-system-x86", "debootstrap": "debootstrap", "mkfs.ext4": "e2fsprogs",
             "dd": "coreutils"}, notices)
    with Session("boot", knobs, notices) as session:
        # A given DEVICE is checked first, so an unsafe one is refused before minutes of build.
        target = None if device is None else session.device(device, destroy_data=destroy_data,
                                                              scratch_size=0)
        image = boot_image.build_image(Path(knobs["cache_dir"]), knobs["suite"],
                                       mirror=knobs["mirror"], notices=notices)
        if target is None:
            target = session.scratch_loop(image.size)
        size = _device_size(target)
        if size < image.size:
            raise RecipeError(f"{target} holds {size // MIB} MiB but the guest image needs "
                              f"{image.size // MIB} MiB; give a larger DEVICE")
        _write_image(image.image, target, sparse=device is None)
        serial = session.tmpdir / "serial.log"
        command = qemu_command(image, target, serial, memory=knobs["memory"], accel=knobs["accel"])
        emulated = knobs["accel"] == "tcg"
        session.provenance["filesystem"] = {
            "type": image.filesystem,
            "mkfs": shlex.join(["mkfs.ext4", *boot_image.MKFS_OPTIONS, "-d", "ROOT", "IMAGE"]),
            "mkfs_version": version_of("mkfs.ext4", "-V"), "image_bytes": image.size,
            "written": "the cached image copied onto DEVICE (dd oflag=direct) before the capture"}
        session.provenance["guest"] = {
            "os": f"Debian {image.suite}", "suite": image.suite, "kernel": image.kernel_version,
            "packages": f"debootstrap --variant=minbase --include={','.join(boot_image.PACKAGES)}",
            "init": "systemd, default target multi-user.target; a unit ordered after it powers off",
            "kernel_command_line": command[command.index("-append") + 1],
            "memory_mib": knobs["memory"], "image_cache_key": boot_image.cache_key(image.suite)}
        session.provenance["applications"] = {"qemu": version_of(QEMU, "--version"),
                                              "debootstrap": _debootstrap_version()}
        session.provenance["emulator"] = {
            "program": QEMU, "accelerator": knobs["accel"],
            "execution": "emulated" if emulated else "hardware-assisted virtualisation",
            "disk": "virtio-blk, cache=none (O_DIRECT on DEVICE), format=raw",
            "command": shlex.join(command)}
        if emulated:
            session.provenance["emulator"]["timing_note"] = (
                "software emulation (TCG) runs the guest's CPU work many times slower than "
                "hardware, so the gaps between I/Os are stretched; the I/O sizes, offsets and "
                "order are the guest's own")
        result, boot = _capture_boot(session, target, output, command, serial, knobs["timeout"],
                                     backend, image, emulated, on_start)
    if not boot["reached_poweroff"]:
        why = (f"did not power off within the {knobs['timeout']:g} s timeout; qemu was ended by its pid"
               if boot["timed_out"] else f"ended without a clean poweroff (qemu exit status "
                                          f"{boot['qemu_status']})")
        notices.append(f"the boot {why}. The trace holds the boot up to then and its metadata says "
                       f"it did not finish. Last serial console lines: {boot['serial_tail']}")
    return result


def _device_size(device: str) -> int:
    fd = os.open(device, os.O_RDONLY)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def _debootstrap_version() -> str:
    done = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "debootstrap"],
                          capture_output=True, text=True)
    return f"debootstrap {done.stdout.strip()}" if done.returncode == 0 and done.stdout else "unknown"


def _capture_boot(session: Session, device: str, output: Path, command: list[str], serial: Path,
                  timeout: float, backend: str, image: boot_image.BootImage, emulated: bool,
                  on_start=None):
    """Session.capture, keeping a boot that ended at the timeout or without a clean poweroff,
    and saying so in the metadata. capture() ends qemu (SIGTERM to its pid, then SIGKILL)
    when `timeout` passes. Returns the CaptureResult and what the boot did."""
    started = time.monotonic()
    boot = {}

    def describe(result):
        seconds = time.monotonic() - started
        log = serial.read_text(errors="replace") if serial.exists() else ""
        status = result.command_status
        powered_off = status == 0 and boot_image.MARKER in log and _POWER_DOWN in log
        # capture() ends qemu at the deadline, and qemu exits 0 on SIGTERM: the clock tells.
        timed_out = not powered_off and seconds >= timeout
        boot.update(reached_multi_user=boot_image.MARKER in log, reached_poweroff=powered_off,
                    timed_out=timed_out, timeout_s=timeout, qemu_status=status,
                    seconds=round(seconds, 2), serial_tail=_serial_tail(serial))
        session.provenance["boot"] = boot
        # The application's own outcome, as the other recipes record it: the boot is fixed work.
        session.provenance["outcome"] = {"elapsed_s": boot["seconds"], "status": status,
                                         "finished": powered_off, "unit": "boot",
                                         "reported_by": "the recipe's clock around qemu"}
        how = "under software emulation (qemu TCG), which stretches the gaps between I/Os" if emulated \
            else "with hardware virtualisation (KVM)"
        ending = ("It reached multi-user.target and powered off." if powered_off else
                  "It did NOT finish: " + ("qemu was ended at the timeout." if timed_out
                                           else f"qemu exited with status {status} without a clean poweroff."))
        return (f"An OS boot: a minimal Debian {image.suite} guest (kernel {image.kernel_version}, "
                f"systemd) booted by qemu from an ext4 filesystem on the traced device, {how}. {ending}")

    result = session.capture(device, output, command=command, description=describe, backend=backend,
                             duration=timeout, on_start=on_start, keep_failed=True)
    return result, boot
