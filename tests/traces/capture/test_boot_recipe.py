"""The `boot` recipe: a real debootstrapped Debian guest booted by qemu from a scratch loop device,
its timeout and teardown, the device checks, and the bundled traces/boot.parquet.

The guest image is built once (a few minutes) into /var/cache/tracereplay and reused after.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_process import replay_process
from analysis.characterise import characterise
from traces.capture.recipes import boot, boot_image
from traces.capture.recipes.common import RecipeError
from traces.errors import ReplayError
from traces.trace import open_trace

BUNDLED = Path(__file__).resolve().parents[3] / "traces" / "boot.parquet"
KIB = 1 << 10


def _validated(path: Path):
    """The trace opened, with every chunk read (each is validated as it is read)."""
    trace = open_trace(path)
    rows = sum(len(chunk["ts_ns"]) for chunk in trace.chunks())
    assert rows == trace.num_rows
    return trace


def _loop_backing_files() -> list[str]:
    """Backing files of every attached loop device."""
    out = subprocess.run(["losetup", "--list", "--json", "--output", "NAME,BACK-FILE"],
                         capture_output=True, text=True, check=True).stdout
    return [d.get("back-file") or "" for d in json.loads(out or "{}").get("loopdevices", [])]


def _qemu_on(device: str) -> list[int]:
    """Pids of qemu processes whose disk is `device`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"qemu-system-x86_64") and any(
                a.startswith(f"file={device},".encode()) for a in argv):
            pids.append(int(entry.name))
    return pids


def _assert_torn_down(metadata: dict):
    """Nothing of the run is left: loop device, its backing directory, qemu, mounts, tracefs."""
    device = metadata["device"]
    assert _qemu_on(device["path"]) == []
    # This run's own scratch device only: other engineers' recipe runs may be under way.
    assert not any(f.startswith(device["loop_backing_file"]) for f in _loop_backing_files())
    workdir = Path(device["loop_backing_file"]).parent
    assert not workdir.exists()
    mounts = Path("/proc/self/mounts").read_text()
    assert str(workdir) not in mounts
    instance = metadata["source"].get("instance")
    if instance:
        assert not Path("/sys/kernel/tracing/instances", instance).exists()


@pytest.mark.root
@pytest.mark.loopdev
def test_boot_recipe_captures_a_real_boot_to_poweroff(tmp_path):
    output = tmp_path / "boot.parquet"
    notices = []
    result = boot.run(None, output, notices=notices)

    assert result.output == output and result.rows > 0
    trace = _validated(output)
    meta = trace.metadata
    rec = meta["recipe"]
    assert rec["recipe"] == "boot" and rec["knobs"]["accel"] == "tcg"
    assert rec["boot"]["reached_multi_user"] and rec["boot"]["reached_poweroff"]
    assert rec["boot"]["timed_out"] is False and rec["boot"]["qemu_status"] == 0
    assert rec["emulator"]["execution"] == "emulated"
    assert "stretches the gaps between I/Os" in meta["description"]
    assert rec["guest"]["suite"] == boot_image.host_suite()
    assert re.fullmatch(r"\d+\.\d+\.\d+-\d+-amd64", rec["guest"]["kernel"])
    assert rec["applications"]["qemu"].startswith("QEMU emulator version")
    assert rec["filesystem"]["type"] == "ext4"
    assert not any("did not" in n for n in notices)

    # The boot's shape: hundreds of requests, mostly reads, 4 KiB and large readahead reads,
    # journal flushes, all inside the image.
    c = characterise(trace)
    assert c.ios > 300
    assert c.read_share_count > 0.7
    assert 4 * KIB in [size for size, _, _ in c.dominant_sizes]
    assert c.size_histogram["<=128 KiB"]["read"] > 0
    assert c.flushes > 0
    assert c.span_bytes <= meta["device_size"]
    _assert_torn_down(meta)


@pytest.mark.root
@pytest.mark.loopdev
def test_boot_timeout_ends_qemu_and_says_the_boot_did_not_finish(tmp_path):
    output = tmp_path / "short.parquet"
    notices = []
    boot.run(None, output, notices=notices, timeout=2)

    said = [n for n in notices if "did not power off within the 2 s timeout" in n]
    assert said and "qemu was ended by its pid" in said[0]
    trace = _validated(output)
    state = trace.metadata["recipe"]["boot"]
    assert state["timed_out"] is True and state["reached_poweroff"] is False
    assert state["seconds"] >= 2
    assert "did NOT finish" in trace.metadata["description"]
    _assert_torn_down(trace.metadata)


@pytest.mark.root
@pytest.mark.loopdev
def test_boot_timeout_from_the_command_line_prints_a_clear_note(tmp_path):
    output = tmp_path / "cli.parquet"
    done = subprocess.run([sys.executable, "-c", "from replay.cli import main; main()", "capture",
                           "recipe", "boot", "-o", str(output), "--timeout", "2"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "note: the boot did not power off within the 2 s timeout" in done.stderr
    assert "Traceback" not in done.stderr
    assert "recipe boot" in done.stdout and str(output) in done.stdout
    _assert_torn_down(_validated(output).metadata)


def _qemu_children(parent: int) -> dict[int, str]:
    """{pid: disk device} of the qemu processes whose parent is `parent`."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(re.search(r"^PPid:\s+(\d+)", status, re.M).group(1))
        if ppid == parent and argv[0].endswith(b"qemu-system-x86_64"):
            drive = next(a.decode() for a in argv if a.startswith(b"file="))
            found[int(entry.name)] = drive.split(",")[0].removeprefix("file=")
    return found


@pytest.mark.root
@pytest.mark.loopdev
def test_boot_ctrl_c_ends_qemu_and_removes_everything(tmp_path):
    output = tmp_path / "interrupted.parquet"
    with replay_process("capture", "recipe", "boot", "-o", output) as proc:
        for line in proc.stderr:
            if "tracing with" in line:
                break
        qemu = {}
        for _ in range(100):  # qemu starts just after tracing does
            qemu = _qemu_children(proc.pid)
            if qemu:
                break
            time.sleep(0.1)
        assert qemu, "qemu did not start"
        backing = [Path(f"/sys/block/{Path(d).name}/loop/backing_file").read_text().strip()
                   for d in qemu.values()]
        time.sleep(2)
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted: no trace was written" in err and "Traceback" not in err
    assert not output.exists()
    assert list(tmp_path.iterdir()) == []
    for device in qemu.values():
        assert _qemu_on(device) == []
    for file in backing:
        assert not any(f.startswith(file) for f in _loop_backing_files())
        assert not Path(file).parent.exists()


@pytest.mark.root
@pytest.mark.loopdev
def test_boot_refuses_a_device_in_use_before_building_anything(tmp_path, loop_device):
    device = loop_device(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", device], check=True, capture_output=True)
    output = tmp_path / "boot.parquet"
    with pytest.raises(RecipeError, match="destroy-data|destroy_data"):
        boot.run(device, output, notices=[], cache_dir=str(tmp_path / "never-built"))
    assert not output.exists()
    assert not (tmp_path / "never-built").exists()
    blkid = subprocess.run(["blkid", "-p", "-o", "value", "-s", "TYPE", device],
                           capture_output=True, text=True)
    assert blkid.stdout.strip() == "ext4"


@pytest.mark.root
@pytest.mark.loopdev
def test_boot_refuses_a_device_smaller_than_the_image(tmp_path, loop_device):
    device = loop_device(64 << 20)
    output = tmp_path / "boot.parquet"
    with pytest.raises(RecipeError, match="holds 64 MiB but the guest image needs"):
        boot.run(device, output, notices=[], destroy_data=True)
    assert not output.exists()
    assert _qemu_on(device) == []


@pytest.mark.root
def test_image_comes_from_the_cache_after_the_first_build():
    first = boot_image.build_image()
    again = boot_image.build_image()
    assert again.built is False
    assert again.image == first.image and again.kernel_version == first.kernel_version
    assert again.image.name == f"boot-{again.suite}-{boot_image.cache_key(again.suite)}.img"
    assert again.size == again.image.stat().st_size


def test_cache_key_follows_what_shapes_the_image():
    assert boot_image.cache_key("bookworm") == boot_image.cache_key("bookworm")
    assert boot_image.cache_key("bookworm") != boot_image.cache_key("trixie")


def test_knobs_are_checked_before_anything_runs(tmp_path):
    with pytest.raises(RecipeError, match="accel"):
        boot.run(None, tmp_path / "x.parquet", notices=[], accel="xen")
    with pytest.raises(RecipeError, match="unknown knob 'cores'"):
        boot.run(None, tmp_path / "x.parquet", notices=[], cores=4)
    with pytest.raises(RecipeError, match="timeout must be positive"):
        boot.run(None, tmp_path / "x.parquet", notices=[], timeout=0)
    with pytest.raises(ReplayError, match="not a Debian suite"):
        boot_image.build_image(tmp_path, "Not a suite")
    assert list(tmp_path.iterdir()) == []


def test_qemu_command_boots_the_device_with_o_direct_under_the_accelerator(tmp_path):
    image = boot_image.BootImage(tmp_path / "i.img", tmp_path / "k", tmp_path / "r", "bookworm",
                                 "6.1.0-1-amd64", 1 << 30, "ext4", False)
    cmd = boot.qemu_command(image, "/dev/loop9", tmp_path / "serial.log", memory=1024, accel="tcg")
    assert cmd[0] == "qemu-system-x86_64" and cmd[cmd.index("-accel") + 1] == "tcg"
    assert "file=/dev/loop9,format=raw,if=virtio,cache=none" in cmd
    assert cmd[cmd.index("-kernel") + 1] == str(tmp_path / "k")
    assert "root=/dev/vda" in cmd[cmd.index("-append") + 1]
    assert "-no-reboot" in cmd


def test_bundled_boot_trace_is_a_captured_boot_mostly_reads():
    trace = _validated(BUNDLED)
    meta = trace.metadata
    assert meta["source"]["kind"].startswith("capture:") and meta["recipe"]["recipe"] == "boot"
    assert meta["recipe"]["boot"]["reached_poweroff"] is True
    assert meta["recipe"]["emulator"]["execution"] == "emulated"
    assert meta["source"]["lost_events"] == 0
    assert meta["name"] == "boot" and meta["license"] == "MIT"
    c = characterise(trace)
    assert 300 < c.ios < 20_000
    assert c.read_share_count > 0.7
    assert 4 * KIB in [size for size, _, _ in c.dominant_sizes]
    assert os.path.getsize(BUNDLED) < 4 << 20


@pytest.mark.root
def test_failed_image_build_says_why_and_leaves_nothing_in_the_cache(tmp_path):
    with pytest.raises(boot_image.ImageBuildError, match="is the mirror reachable") as info:
        boot_image.build_image(tmp_path, "bookworm", mirror="http://127.0.0.1:9/debian")
    assert "debootstrap failed" in str(info.value)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [f"boot-bookworm-{boot_image.cache_key('bookworm')}.lock"]
