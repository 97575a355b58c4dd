"""The Ray cluster a command works on: one joined at HOST:PORT, the one `ray start` runs on this
machine (`auto`), or one started for the command on 127.0.0.1 and ended with it, every process
it started included (`local`). Ray is an optional extra, imported only here and only when asked.
"""
import contextlib
import ctypes
import ipaddress
import logging
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from traces import workdirs
from traces.errors import ReplayError

LOCAL, AUTO = "local", "auto"
# Ray resolves 127.0.0.1 to the machine's outward address unless told it runs no
# multi-node cluster; for a cluster on loopback that is what keeps every byte on loopback.
_RAY_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# What a cluster's processes get to end when the block ends, before they are killed.
_STOP_WAIT_S = 5.0
_PR_SET_CHILD_SUBREAPER = 36


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]") if ":" in address else address
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ray_module():
    try:
        import ray
    except ImportError:
        raise ReplayError("--cluster needs Ray, an optional extra: pip install 'tracereplay[cluster]'") from None
    return ray


@contextlib.contextmanager
def ray_session(address: str):
    """The ray module, connected for the block to the cluster at `address`: HOST:PORT of a
    head, `auto` or `local` (see the module's header); disconnected, or for `local` ended,
    however the block ends."""
    if address == LOCAL:
        with _local_cluster() as ray:
            yield ray
        return
    ray = _join(_running_here() if address == AUTO else address)
    try:
        yield ray
    finally:
        ray.shutdown()


def _running_here() -> str:
    """The address of the cluster the last `ray start` on this machine began, as Ray records it;
    not any Ray process found running, which may be someone else's."""
    record = Path(os.environ.get("RAY_TMPDIR", tempfile.gettempdir())) / "ray" / "ray_current_cluster"
    try:
        return record.read_text().split()[0]
    except (OSError, IndexError):
        raise ReplayError("--cluster auto: no Ray cluster was started on this machine; start one with "
                          "`ray start --head --node-ip-address=127.0.0.1`, or give --cluster local for "
                          "one that lasts as long as the command") from None


def _reachable(address: str) -> None:
    """Fail in a second, not after Ray's minutes of retries, when nothing listens there."""
    if "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ReplayError(f"--cluster {address}: give the head node's HOST:PORT (as `ray start --head` "
                          "prints it), auto or local")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=3).close()
    except OSError as e:
        raise ReplayError(f"cannot reach the Ray cluster at {address} ({e.strerror or e}); "
                          "start it with `ray start --head` or check the address") from None


def _auth_mode(address: str) -> None:
    """Ray >= 2.52 may require a token (RAY_AUTH_MODE=token) and a driver must match its head:
    a head that wants one refuses a driver without (InvalidAuthToken), and a driver with one
    refuses the calls of workers without. A head on this machine says which by its environment;
    else follow `ray start --head`, which wants a token where one is saved (~/.ray/auth_token,
    which any `ray.init()` writes). RAY_AUTH_MODE, when set, decides instead; older Rays ignore
    these variables."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    head = _local_head_environ(address.rpartition(":")[2])
    if head is not None:
        wanted = head.get("RAY_AUTH_MODE") == "token"
    else:
        saved = os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token"
        wanted = bool(os.environ.get("RAY_AUTH_TOKEN")) or Path(saved).is_file()
    if wanted:
        os.environ["RAY_AUTH_MODE"] = "token"


def _local_head_environ(port: str) -> dict | None:
    """The environment of the GCS server listening on `port` here, if it runs here and is ours."""
    pid = _listener(int(port)) if port.isdigit() else None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if not f.read().split(b"\0")[0].endswith(b"gcs_server"):
                return None
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(v.decode(errors="replace").partition("=")[::2] for v in f.read().split(b"\0") if v)
    except OSError:
        return None


def _listener(port: int) -> int | None:
    """The pid of the process listening on TCP `port` here (Linux /proc), if one of ours."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()  # sl, local address, remote address, state (0A: listen), ...
                if fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    for entry in os.scandir("/proc") if inodes else ():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if any(os.readlink(fd.path) in inodes for fd in os.scandir(f"/proc/{entry.name}/fd")):
                    return int(entry.name)
    return None


def _join(address: str):
    _reachable(address)
    # Both before ray is imported: Ray reads them at import.
    if is_loopback(address):
        os.environ.setdefault(_RAY_LOOPBACK_ENV, "0")
    _auth_mode(address)
    ray = ray_module()
    if not ray.is_initialized():
        kwargs = {"_node_ip_address": "127.0.0.1"} if is_loopback(address) else {}
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False,
                     configure_logging=True, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ReplayError(f"cannot join the Ray cluster at {address}: {e}") from None
    return ray


@contextlib.contextmanager
def _local_cluster():
    """A one-node Ray on 127.0.0.1 for the block: every process listens on loopback only, no
    web dashboard, a token of its own (nobody else on the machine joins it, and no token is
    left in ~/.ray to turn authentication on in a later `ray start`), its files in a temporary
    directory. A keeper process starts it and, when the block ends or this process dies
    however it dies, ends every process the cluster started and no other."""
    settings = {_RAY_LOOPBACK_ENV: "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    # Owned (traces.workdirs): should the keeper be killed too, the next run removes it.
    files = str(workdirs.make("tracereplay-ray-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    with open(Path(files) / "keeper.log", "wb") as log:
        # Its own session: a Ctrl-C at the terminal reaches this process, not Ray's.
        keeper = subprocess.Popen([sys.executable, "-c", "from replay.ray_session import _keep; _keep()",
                                   address, files], stdin=subprocess.PIPE, stdout=log, stderr=log,
                                  env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                                  start_new_session=True)
    try:
        _await_head(keeper, address, Path(files) / "keeper.log")
        ray = _join(address)
        try:
            yield ray
        finally:
            ray.shutdown()
    finally:
        keeper.stdin.close()  # the keeper's signal to end the cluster
        try:
            keeper.wait(timeout=3 * _STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            keeper.kill()
            keeper.wait()
        workdirs.remove(Path(files))
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _await_head(keeper: subprocess.Popen, address: str, log: Path, timeout_s: float = 120) -> None:
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            pass
        if keeper.poll() is not None or time.monotonic() > deadline:
            said = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
            raise ReplayError("cannot start a local Ray cluster: "
                              + (said[-1] if said else f"nothing listens at {address}"))
        time.sleep(0.1)


def _keep() -> None:
    """The keeper's body, a process of its own (args: ADDRESS FILES): start a Ray head below it,
    and when its stdin closes (the command ended, however) or the head stops, end every
    process below it (Ray's orphans come back to it, not to init) and remove FILES."""
    address, files = sys.argv[1:3]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _adopt_orphans()
    head = subprocess.Popen([sys.executable, "-c", "from ray.scripts.scripts import main; main()",
                             "start", "--head", "--block", f"--port={address.rpartition(':')[2]}",
                             "--node-ip-address=127.0.0.1", "--include-dashboard=false",
                             "--disable-usage-stats", f"--temp-dir={files}"], stdin=subprocess.DEVNULL)
    select.select([sys.stdin.fileno(), os.pidfd_open(head.pid)], [], [])
    _end(_descendants())
    shutil.rmtree(files, ignore_errors=True)  # the command may have died before it could


def _adopt_orphans() -> None:
    """Become the parent of any descendant whose parent dies (Linux): a raylet or a driver that
    crashes leaves the node's agents and workers running, reparented to init, where no one
    ends them."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _descendants() -> set[int]:
    """The pids of every process below this one (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    # The name, in parentheses, may hold spaces: the fields after it are plain.
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    """Running, and not a zombie; a zombie child of ours is reaped on the way."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _end(pids: set[int]) -> None:
    """SIGTERM `pids`, then after _STOP_WAIT_S SIGKILL those still running and any process
    below this one that started meanwhile; reaped."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + _STOP_WAIT_S
        while (pids := {p for p in pids if _alive(p)}) and time.monotonic() < deadline:
            time.sleep(0.05)
        pids |= {p for p in _descendants() if _alive(p)}
        if not pids:
            return
