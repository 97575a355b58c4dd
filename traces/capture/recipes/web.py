"""Recipe `web`: Debian's nginx serving a static tree on DEVICE to a local load generator over
127.0.0.1, captured.

The tree (thousands of files of web-like sizes) is written before the capture and the
filesystem remounted, so the server starts cold. A private nginx (its own config, `daemon
off`, listening on 127.0.0.1 only, on a free port) runs inside the memory cgroup and is
stopped by its pid; captured: a fixed number of requests over a Zipf-popular list of URLs,
and nginx's access log on the same filesystem.
"""
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from traces.capture.recipes import timed, web_load
from traces.capture.recipes.common import (GIB, MIB, RecipeError, Session, parse_knobs, require, stop_process,
                                           version_of)
from traces.capture.recipes.common import run as sh

DESCRIPTION = ("A web server: nginx serves a static tree of pages, style sheets, scripts and images, "
               "cold, to local clients fetching a Zipf-popular set of URLs over keep-alive connections; "
               "small and medium reads, and the access log's appends.")

KNOBS = {
    "files": (int, 10_000, "Files in the static tree, written before the capture."),
    "requests": (int, 100_000, "Fixed work: this many GET requests, shared by the clients."),
    "clients": (int, 8, "Client threads, each on one keep-alive connection."),
    "zipf": (float, 1.0, "Exponent of the URLs' Zipf popularity (file of rank k fetched in proportion "
                         "to 1/k^zipf)."),
    "memory_mb": (int, 64, "Memory cgroup limit for nginx, MiB (the page cache of the files it serves "
                           "counts); keep it below the tree's size."),
    "seed": (int, 1, "Seed of the tree's sizes and contents and of the URL list."),
    "fs": (str, "ext4", "Filesystem made on the device: ext4 or xfs."),
}
TOOLS = {"nginx": "nginx"}
# Web-like sizes per kind of file: (extension, share of the files, median bytes, log-normal sigma).
KINDS = (("html", 0.15, 24 << 10, 0.8), ("css", 0.10, 12 << 10, 1.0), ("js", 0.20, 40 << 10, 1.2),
         ("jpg", 0.35, 64 << 10, 1.2), ("png", 0.20, 12 << 10, 1.3))
MIN_FILE, MAX_FILE = 256, 4 * MIB
_DIRS = 64
_START_S = 30
_CONF = """daemon off;
user root;
worker_processes 2;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{ worker_connections 256; }}
http {{
    types {{ text/html html; text/css css; application/javascript js; image/jpeg jpg; image/png png; }}
    default_type application/octet-stream;
    sendfile on;
    access_log {root}/logs/access.log;
    server {{
        listen 127.0.0.1:{port};
        root {root}/www;
    }}
}}
"""


def make_tree(root: Path, knobs: dict) -> tuple[list[str], dict]:
    """Write the static tree under `root`; returns its URL paths and {files, bytes, by kind}."""
    rng = np.random.default_rng(knobs["seed"])
    kinds = rng.choice(len(KINDS), size=knobs["files"], p=[k[1] for k in KINDS])
    urls, total, by_kind = [], 0, {k[0]: 0 for k in KINDS}
    for i, kind in enumerate(kinds):
        ext, _share, median, sigma = KINDS[kind]
        size = int(np.clip(rng.lognormal(np.log(median), sigma), MIN_FILE, MAX_FILE))
        url = f"/d{i % _DIRS:02d}/f{i:05d}.{ext}"
        path = root / url[1:]
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(rng.bytes(size))
        urls.append(url)
        total += size
        by_kind[ext] += 1
    return urls, {"files": len(urls), "bytes": total, "kinds": by_kind}


def url_list(urls: list[str], knobs: dict) -> list[str]:
    """knobs["requests"] URLs drawn by Zipf popularity; ranks are shuffled over the files so
    that the popular ones are scattered over the tree, not its first directory."""
    rng = np.random.default_rng(knobs["seed"] + 1)
    ranked = rng.permutation(len(urls))
    weights = 1.0 / np.arange(1, len(urls) + 1) ** knobs["zipf"]
    picks = rng.choice(ranked, size=knobs["requests"], p=weights / weights.sum())
    return [urls[i] for i in picks]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(pids) -> list[str]:
    """The addresses ("127.0.0.1:8080") that processes `pids` listen on, over TCP and TCP6."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = fd.readlink().name
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                raw = bytes.fromhex(address)
                # /proc prints each 32-bit word of the address in host (little-endian) order.
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                host = socket.inet_ntop(socket.AF_INET if table == "tcp" else socket.AF_INET6, words)
                found.append(f"{host}:{int(port, 16)}")
    return sorted(set(found))


class Nginx:
    """Our nginx (`daemon off`, so the pid we started is its master), stopped by that pid."""

    def __init__(self, command: list, port: int, error_log: Path):
        self.proc = subprocess.Popen([str(c) for c in command], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + _START_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    tail = " | ".join(error_log.read_text(errors="replace").strip().splitlines()[-3:]
                                      if error_log.exists() else [])
                    raise RecipeError(f"nginx did not start (its error log: {tail})") from None
                time.sleep(0.05)

    def pids(self) -> list[int]:
        """The master and its workers."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        try:
            return [self.proc.pid, *map(int, children.read_text().split())]
        except OSError:
            return []

    def stop(self) -> None:
        stop_process(self.proc, _START_S)


def run(device, output, *, notices, destroy_data=False, backend="auto", on_start=None, **given):
    knobs = parse_knobs(KNOBS, given)
    require(TOOLS, notices)
    with Session("web", knobs, notices) as s:
        # The tree averages about 50 KiB a file; the log, and room to spare.
        dev = s.device(device, destroy_data=destroy_data,
                       scratch_size=max(GIB, knobs["files"] * 150 * 1024 + GIB))
        mnt = s.filesystem(dev, knobs["fs"])
        s.provenance["applications"] = {"nginx": version_of("nginx", "-v")}
        (mnt / "www").mkdir()
        (mnt / "logs").mkdir()
        urls, tree = make_tree(mnt / "www", knobs)
        s.provenance["tree"] = {"on": "the traced filesystem, written before the capture", **tree}
        url_file = s.tmpdir / "urls.txt"  # off the device
        url_file.write_text("\n".join(url_list(urls, knobs)) + "\n")
        s.remount()  # the tree on the device, none of it in the page cache
        cgroup = s.memory_cgroup(knobs["memory_mb"] * MIB)
        port = free_port()
        conf, error_log = s.tmpdir / "nginx.conf", s.tmpdir / "error.log"
        conf.write_text(_CONF.format(tmp=s.tmpdir, root=mnt, port=port))
        server = Nginx(cgroup.wrap(["nginx", "-p", s.tmpdir, "-e", error_log, "-c", conf]), port, error_log)
        s.defer(server.stop)  # before the cgroup's removal ends what is left
        bound = listening(server.pids())
        if bound != [f"127.0.0.1:{port}"]:
            raise RecipeError(f"nginx listens on {', '.join(bound) or 'nothing'}, not only 127.0.0.1:{port}")
        s.provenance["server"] = {"listening": bound, "worker_processes": 2, "sendfile": True,
                                  "access_log": "on the traced filesystem"}
        load = [sys.executable, "-m", web_load.__name__, url_file, "--port", port,
                "--clients", knobs["clients"]]
        s.provenance["workload"] = (f"web_load URLS --port PORT --clients {knobs['clients']}: {knobs['requests']} "
                                    f"GETs over a Zipf({knobs['zipf']}) popularity; then sync -f")
        outcome_file = s.tmpdir / "outcome.json"

        def describe(result):
            recorded = timed.read(outcome_file)
            logged = (mnt / "logs" / "access.log").read_text(errors="replace").count("\n")
            s.provenance["outcome"] = outcome(recorded, logged)
            return (f"{DESCRIPTION} {knobs['requests']} requests by {knobs['clients']} clients over "
                    f"{tree['files']} files ({tree['bytes'] / MIB:.0f} MiB), Zipf exponent {knobs['zipf']}, "
                    f"memory limited to {knobs['memory_mb']} MiB, {knobs['fs']} on the device.")

        # The clients run outside the cgroup: they read no files, and their interpreter's
        # memory would only crowd the server's page cache. `sync -f` at the end puts the
        # access log's appends on the device within the capture, not after it.
        work = ["sh", "-c", '"$@"; status=$?; sync -f "$0" && exit $status', mnt, *load]
        return s.capture(dev, output, command=timed.wrap(outcome_file, work), backend=backend,
                         description=describe, on_start=on_start)


def outcome(recorded: dict, logged: int) -> dict:
    """The clients' own figures (requests, bytes, errors, latency) and the requests nginx logged."""
    lines = recorded.get("output", "").strip().splitlines()
    try:
        figures = json.loads(lines[-1]) if lines else {}
    except ValueError:
        figures = {}
    return timed.outcome(recorded, **figures, logged_requests=logged, unit="requests",
                         reported_by="the load generator's clients, and nginx's access log")
