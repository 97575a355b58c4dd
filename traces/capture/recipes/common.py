"""What every capture recipe shares: a scratch loop device or a checked DEVICE, mkfs and a
private mount, a memory cgroup, missing Debian packages, and provenance in the trace.

A `Session` owns everything a recipe sets up and removes it in reverse order however the
recipe ends: success, an exception, Ctrl-C or SIGTERM.
"""
import contextlib
import datetime
import glob
import os
import platform
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from traces.errors import ReplayError

__all__ = ["RecipeError", "Session", "MemoryCgroup", "parse_knobs", "require", "missing_packages",
           "mounts_under", "version_of", "run", "stop_process"]

MIB = 1 << 20
GIB = 1 << 30
# ext4's lazy inode-table and journal initialisation writes in the background for minutes
# after mkfs; it would land in the capture, so the recipes initialise everything up front.
EXT4_OPTIONS = ("-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0")
XFS_OPTIONS = ("-f", "-q")
_TERM_GRACE_S = 5.0


class RecipeError(ReplayError):
    """A recipe cannot run: bad knob, missing package, unsafe device, failed setup step."""


def run(args, *, what: str | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Run a set-up command; a failure raises RecipeError with its stderr's last lines."""
    args = [str(a) for a in args]
    try:
        done = subprocess.run(args, capture_output=True, text=True, **kwargs)
    except OSError as exc:
        raise RecipeError(f"cannot run {args[0]}: {exc.strerror}") from None
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout or "").strip().splitlines()[-3:])
        raise RecipeError(f"{what or shlex.join(args)} failed (exit {done.returncode}): {tail}")
    return done


def stop_process(proc: subprocess.Popen, grace_s: float) -> None:
    """End a server the recipe started, by its pid: SIGTERM (the clean shutdown of mariadbd and
    nginx alike), then SIGKILL if it is still there after `grace_s`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def version_of(*args) -> str:
    """The first line a program prints for its version (`postgres --version`), or "unknown"."""
    try:
        done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0].strip() if lines else "unknown"


def parse_knobs(spec: dict, given: dict) -> dict:
    """`given` ({name: value or text}) checked against `spec` and completed with defaults."""
    unknown = sorted(set(given) - set(spec))
    if unknown:
        raise RecipeError(f"unknown knob {unknown[0]!r}; the knobs are: {', '.join(spec)}")
    knobs = {}
    for name, (type_, default, _help) in spec.items():
        value = given.get(name, default)
        if value is None:
            knobs[name] = None
            continue
        try:
            value = type_(value)
        except (TypeError, ValueError):
            raise RecipeError(f"knob {name}: {value!r} is not a {type_.__name__}") from None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
            raise RecipeError(f"knob {name} must be positive, not {value}")
        knobs[name] = value
    return knobs


def _present(tool: str) -> bool:
    """A program on PATH, or for an absolute path (a glob), a file that matches it."""
    return bool(glob.glob(tool)) if tool.startswith("/") else shutil.which(tool) is not None


def missing_packages(tools: dict[str, str]) -> list[str]:
    """The Debian packages of `tools` ({program or file: package}) that are not installed."""
    return sorted({pkg for tool, pkg in tools.items() if not _present(tool)})


POLICY_RC_D = Path("/usr/sbin/policy-rc.d")


@contextlib.contextmanager
def no_service_starts(policy: Path = POLICY_RC_D):
    """While it lasts, Debian's maintainer scripts start no service: invoke-rc.d asks
    `policy`, and its exit 101 says no (installing nginx would otherwise start a system nginx on
    port 80 on a host with systemd). Ours is removed at the end, even on an error or Ctrl-C; a
    policy already there is the host's, used and left alone. The Makefile's `packages` does the same.
    """
    if policy.exists():
        yield
        return
    try:
        policy.write_text("#!/bin/sh\n# tracereplay: no service starts while a recipe installs packages.\n"
                          "exit 101\n")
        policy.chmod(0o755)
    except OSError as exc:
        policy.unlink(missing_ok=True)
        raise RecipeError(f"cannot write {policy} to keep the packages' services from starting: "
                          f"{exc.strerror}") from None
    try:
        yield
    finally:
        policy.unlink(missing_ok=True)


def require(tools: dict[str, str], notices: list, *, install: bool = True) -> None:
    """Make sure each program of `tools` ({program: Debian package}) is on PATH; a key that is
    an absolute path (a glob: "/usr/src/linux-source-*.tar.xz") is a file the package ships.

    Missing ones are installed with apt-get when `install` and running as root; otherwise,
    or when that fails, RecipeError names the packages to install.
    """
    missing = missing_packages(tools)
    if not missing:
        return
    hint = f"install the Debian package(s) {' '.join(missing)} (apt-get install {' '.join(missing)})"
    if not install or os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RecipeError(f"missing programs; {hint}")
    notices.append(f"installing {' '.join(missing)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    with no_service_starts():
        if subprocess.run(cmd, capture_output=True, env=env).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env)
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                raise RecipeError(f"apt-get could not install {' '.join(missing)}; {hint}")
    still = sorted(tool for tool in tools if not _present(tool))
    if still:
        raise RecipeError(f"{', '.join(still)} still missing after installing; {hint}")


def _find_mount(fstype: str) -> list[Path]:
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == fstype:
            found.append(Path(fields[1]))
    return found


def mounts_under(path: Path) -> list[str]:
    """The mount points below `path` (what a chroot's tools, debootstrap, mounted there)."""
    prefix = str(Path(path).resolve()) + os.sep
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point.startswith(prefix):
                points.append(point)
    return points


class MemoryCgroup:
    """A private memory cgroup (v2 memory.max, or v1 memory.limit_in_bytes on hybrid hosts).

    Page cache is charged to the cgroup of the process that reads or writes it, so with a
    limit below the working set the application's reads reach the device. `wrap(cmd)` runs
    a command inside it; `remove()` ends what is left inside (all started by the recipe) and
    removes the cgroup.
    """

    def __init__(self, name: str, limit_bytes: int):
        self.limit_bytes = int(limit_bytes)
        self.version, root = self._root()
        self.path = root / f"tracereplay-{name}-{os.getpid()}-{time.monotonic_ns() % 10**6}"
        try:
            self.path.mkdir()
        except OSError as exc:
            raise RecipeError(f"cannot create the memory cgroup {self.path}: {exc.strerror}; "
                              "run as root on a host that delegates cgroups") from None
        try:
            if self.version == "v2":
                (self.path / "memory.max").write_text(str(self.limit_bytes))
                with contextlib.suppress(OSError):  # absent without swap accounting
                    (self.path / "memory.swap.max").write_text("0")
            else:
                (self.path / "memory.limit_in_bytes").write_text(str(self.limit_bytes))
        except OSError as exc:
            self.path.rmdir()
            raise RecipeError(f"cannot set the memory limit of {self.path}: {exc.strerror}") from None

    @staticmethod
    def _root() -> tuple[str, Path]:
        for root in _find_mount("cgroup2"):
            controllers = (root / "cgroup.controllers").read_text().split()
            if "memory" in controllers:
                control = root / "cgroup.subtree_control"
                if "memory" not in control.read_text().split():
                    try:
                        control.write_text("+memory")
                    except OSError:
                        continue
                return "v2", root
        for root in _find_mount("cgroup"):
            if (root / "memory.limit_in_bytes").exists():
                return "v1", root
        raise RecipeError("no memory cgroup controller is mounted (cgroup v2 with memory, or v1 "
                          "memory); the recipes need one so that the page cache does not hide reads")

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def wrap(self, command: list[str]) -> list[str]:
        """`command` made to enter this cgroup first (a shell writes its pid, then execs)."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.procs), *map(str, command)]

    def add(self, pid: int) -> None:
        self.procs.write_text(str(pid))

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs.read_text().split()]
        except OSError:
            return []

    def describe(self) -> dict:
        return {"cgroup": self.version, "memory_limit_bytes": self.limit_bytes}

    def remove(self) -> None:
        """End every process left in the cgroup (SIGTERM, then SIGKILL), then remove it."""
        for sig, grace in ((signal.SIGTERM, _TERM_GRACE_S), (signal.SIGKILL, _TERM_GRACE_S)):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.05)
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:  # EBUSY while the last exits are accounted
                time.sleep(0.05)
        raise RecipeError(f"cannot remove the cgroup {self.path}; processes left: {self.pids()}")


class Session:
    """Everything one recipe run sets up, removed in reverse order when the `with` ends.

    SIGTERM becomes KeyboardInterrupt inside the session, so it tears down like Ctrl-C;
    further Ctrl-C is ignored while tearing down. A teardown step that fails becomes a
    notice, never a masking exception.
    """

    def __init__(self, recipe: str, knobs: dict, notices: list):
        self.recipe = recipe
        self.knobs = dict(knobs)
        self.notices = notices
        self.provenance: dict = {"recipe": recipe, "knobs": dict(knobs), "applications": {}}
        self._stack = contextlib.ExitStack()
        self._old_handlers = {}
        self.tmpdir: Path | None = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old_handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_term)
        self._stack.__enter__()
        # The pid in the name tells concurrent runs' scratch files, mounts and processes apart.
        self.tmpdir = Path(tempfile.mkdtemp(prefix=f"tracereplay-{self.recipe}-{os.getpid()}-"))
        self.defer(shutil.rmtree, self.tmpdir, ignore_errors=True)
        return self

    @staticmethod
    def _on_term(signum, frame):
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        main = threading.current_thread() is threading.main_thread()
        if main:
            old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            self._stack.__exit__(None, None, None)
        finally:
            if main:
                signal.signal(signal.SIGINT, old_int)
                for sig, old in self._old_handlers.items():
                    signal.signal(sig, old)
        return False

    def defer(self, fn, *args, **kwargs) -> None:
        """Run `fn(*args, **kwargs)` at teardown (last deferred runs first)."""
        def step():
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - teardown reports and carries on
                self.notices.append(f"teardown: {getattr(fn, '__name__', fn)} failed: {exc}")
        self._stack.callback(step)

    # -- the device ---------------------------------------------------------------------

    def device(self, device: str | None, *, destroy_data: bool, scratch_size: int) -> str:
        """DEVICE checked as safe to format, or a scratch loop device of `scratch_size` bytes."""
        if device is None:
            return self.scratch_loop(scratch_size)
        from traces.targets import check_safe_to_write, inspect_target

        target = inspect_target(device)
        if target.kind != "block":
            raise RecipeError(f"{device} is not a block device; a recipe formats a block device "
                              "(omit DEVICE for a scratch loop device)")
        try:
            check_safe_to_write(target, destroy_data)
        except ReplayError as exc:
            raise RecipeError(f"{exc} (a recipe makes a new filesystem on it)") from None
        self.provenance["device"] = {"kind": "given", "path": target.path, "size": target.size,
                                     "model": target.model}
        return target.path

    def scratch_loop(self, size: int, directory: str | None = None) -> str:
        """A sparse file attached with `losetup --direct-io=on`, detached and removed at teardown."""
        require({"losetup": "mount"}, self.notices)
        directory = Path(directory) if directory else self.tmpdir
        fs = os.statvfs(directory)
        if fs.f_bavail * fs.f_frsize < size:
            raise RecipeError(f"the scratch device needs {size // MIB} MiB but {directory} has "
                              f"{fs.f_bavail * fs.f_frsize // MIB} MiB free; give a DEVICE or a "
                              "smaller size knob")
        image = Path(tempfile.mkstemp(prefix="scratch-", suffix=".img", dir=directory)[1])
        self.defer(image.unlink, missing_ok=True)
        os.truncate(image, size)
        dev = run(["losetup", "--direct-io=on", "--find", "--show", image]).stdout.strip()
        self.defer(run, ["losetup", "--detach", dev])
        self.provenance["device"] = {"kind": "scratch loop device (losetup --direct-io=on over a "
                                             "sparse file)", "size": size}
        return dev

    def filesystem(self, device: str, fstype: str = "ext4", mount_options: str = "noatime") -> Path:
        """mkfs on `device` and mount it on a private directory; unmounted at teardown."""
        if fstype == "ext4":
            tool, options, pkg = "mkfs.ext4", EXT4_OPTIONS, "e2fsprogs"
        elif fstype == "xfs":
            tool, options, pkg = "mkfs.xfs", XFS_OPTIONS, "xfsprogs"
        else:
            raise RecipeError(f"filesystem {fstype!r} is not supported; use ext4 or xfs")
        require({tool: pkg, "mount": "mount"}, self.notices)
        run([tool, *options, device])
        mountpoint = self.tmpdir / "mnt"
        mountpoint.mkdir()
        run(["mount", "-o", mount_options, device, mountpoint])
        self.defer(self._umount, mountpoint)
        self._mount = (device, mountpoint, mount_options)
        self.provenance["filesystem"] = {"type": fstype, "mkfs": shlex.join([tool, *options, "DEVICE"]),
                                         "mount_options": mount_options,
                                         "mkfs_version": version_of(tool, "-V")}
        return mountpoint

    @staticmethod
    def _umount(mountpoint: Path) -> None:
        for _ in range(50):
            if subprocess.run(["umount", mountpoint], capture_output=True).returncode == 0:
                return
            time.sleep(0.1)  # EBUSY while killed processes release their files
        run(["umount", "--lazy", mountpoint])

    def remount(self) -> None:
        """Unmount and mount the filesystem again: written data reaches the device and its
        page cache is dropped, so the captured phase starts cold and without old writeback."""
        device, mountpoint, options = self._mount
        run(["umount", mountpoint])
        run(["mount", "-o", options, device, mountpoint])

    def memory_cgroup(self, limit_bytes: int) -> MemoryCgroup:
        """A memory cgroup limited to `limit_bytes`, removed (its processes ended) at teardown."""
        cgroup = MemoryCgroup(self.recipe, limit_bytes)
        self.defer(cgroup.remove)
        self.provenance["memory"] = cgroup.describe()
        return cgroup

    def tmpfs(self, size: int) -> Path:
        """A private tmpfs of `size` bytes (a source that adds no I/O to the traced device)."""
        where = self.tmpdir / "tmpfs"
        where.mkdir()
        run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tracereplay-recipe", where])
        self.defer(self._umount, where)
        return where

    # -- the capture --------------------------------------------------------------------

    def capture(self, device: str, output, *, command: list[str], description,
                backend: str = "auto", duration: float | None = None, name: str | None = None,
                on_start=None, keep_failed: bool = False):
        """Capture `device` while `command` runs and write `output` with the recipe's
        provenance merged into the metadata. A command that fails raises RecipeError and
        leaves no output, unless `keep_failed`. `description` is the trace's description, or
        a function of the CaptureResult that returns it (and may add to the provenance)."""
        from traces.capture import capture
        from traces.trace import read_trace, write_trace

        output = Path(output)
        partial = output.with_name(f".{output.name}.{os.getpid()}.capture")
        self.defer(partial.unlink, missing_ok=True)
        date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        # On a shared machine other work stretches a CPU-bound workload's run time; say how busy.
        load_before = os.getloadavg()[0]
        result = capture(device, partial, command=command, duration=duration, backend=backend,
                         name=name or output.name.removesuffix(".parquet"), notices=self.notices,
                         on_start=on_start)
        if result.interrupted:
            raise KeyboardInterrupt
        if result.command_status and not keep_failed:
            raise RecipeError(f"the {self.recipe} workload exited with status {result.command_status}; "
                              "no trace was written")
        columns, metadata = read_trace(partial)
        self.provenance.update(kernel=platform.release(), backend=result.backend, date=date,
                               host=platform.node(), cpus=os.cpu_count(),
                               load_average={"start": load_before, "end": os.getloadavg()[0]})
        metadata["description"] = description(result) if callable(description) else description
        metadata.setdefault("license", "MIT")  # the project's: recipe traces ship in its library
        metadata["source"]["recipe"] = self.recipe
        metadata["recipe"] = self.provenance
        metadata["provenance"] = (f"captured on {platform.node()} by `replay capture recipe "
                                  f"{self.recipe}` ({metadata['provenance']})")
        write_trace(output, columns, metadata)
        result.output = output
        result.metadata = metadata
        return result
