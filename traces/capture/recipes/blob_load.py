"""The BLOB store's load generator, run as its own process inside the memory cgroup.

A SharePoint-like document store: blob bodies are files (`blobs/XX/ID`), their metadata
rows live in SQLite (WAL mode, synchronous=FULL). `populate` fills the store; `mixed`
runs clients doing 80 % GET (skewed to recent and popular blobs), 15 % PUT (write a temp
file, fsync, rename, fsync the directory, then commit the row) and 5 % DELETE.

    python -m traces.capture.recipes.blob_load populate ROOT --mb 2048 --seed 1
    python -m traces.capture.recipes.blob_load mixed ROOT --duration 60 --clients 4 --rate 200
    python -m traces.capture.recipes.blob_load mixed ROOT --ops 2000 --clients 4 --outcome out.json

With --ops the work is fixed: the clients share that many operations and run them back to
back (a closed loop), so the run takes as long as the drive makes it; --outcome writes the
store's own figures (operations, operations/s, latency per operation) as JSON.
"""
import argparse
import json
import multiprocessing
import os
import queue
import sqlite3
import sys
import time
from pathlib import Path

import numpy as np

KIB = 1024
MIN_BLOB, MEDIAN_BLOB, MAX_BLOB = 64 * KIB, 256 * KIB, 8 * 1024 * KIB
# Log-normal sizes around the median; sigma 1.0 puts ~5 % above 1.3 MiB and clips the
# tails at 64 KiB and 8 MiB.
SIGMA = 1.0
MIX = (("get", 0.80), ("put", 0.15), ("delete", 0.05))


def blob_size(rng) -> int:
    size = int(rng.lognormal(np.log(MEDIAN_BLOB), SIGMA))
    return min(MAX_BLOB, max(MIN_BLOB, size // 4096 * 4096 or MIN_BLOB))


def connect(root: Path) -> sqlite3.Connection:
    db = sqlite3.connect(root / "index.sqlite", timeout=60, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db


def blob_path(root: Path, blob_id: int) -> Path:
    return root / "blobs" / f"{blob_id % 256:02x}" / f"{blob_id:08d}"


def _write_durably(root: Path, blob_id: int, body: bytes) -> Path:
    path = blob_path(root, blob_id)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    dirfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)
    return path


def populate(root: Path, mb: int, seed: int) -> None:
    """Fill the store with about `mb` MiB of incompressible blobs, without per-blob fsync."""
    rng = np.random.default_rng(seed)
    for d in range(256):
        (root / "blobs" / f"{d:02x}").mkdir(parents=True, exist_ok=True)
    db = connect(root)
    # AUTOINCREMENT: a deleted blob's id is never handed out again, so two PUTs never
    # share a file name.
    db.execute("CREATE TABLE IF NOT EXISTS blobs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, size INTEGER, "
               "created REAL, etag TEXT, content_type TEXT)")
    total, blob_id = 0, 0
    db.execute("BEGIN")
    while total < mb * KIB * KIB:
        blob_id += 1
        size = blob_size(rng)
        blob_path(root, blob_id).write_bytes(rng.bytes(size))
        db.execute("INSERT INTO blobs VALUES (?, ?, ?, ?, ?, ?)",
                   (blob_id, f"doc-{blob_id}.bin", size, time.time(), f"{rng.integers(1 << 62):x}",
                    "application/octet-stream"))
        total += size
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def _pick(rng, db) -> int | None:
    """A blob id skewed to recent and popular ones: Zipf over recency rank, half the time,
    a uniformly random older blob otherwise."""
    (top,) = db.execute("SELECT max(id) FROM blobs").fetchone()
    if top is None:
        return None
    if rng.random() < 0.5:
        want = top - (int(rng.zipf(1.3)) - 1)
    else:
        want = int(rng.integers(1, top + 1))
    row = db.execute("SELECT id FROM blobs WHERE id <= ? ORDER BY id DESC LIMIT 1", (want,)).fetchone()
    return row[0] if row else top


def client(root: Path, until: float, rate: float, seed: int, counts, ops: int | None = None) -> None:
    """One client: operations at `rate` per second (Poisson arrivals) until `until`, or with
    `ops`, that many operations back to back."""
    rng = np.random.default_rng(seed)
    db = connect(root)
    names, weights = zip(*MIX)
    due = time.monotonic()
    done = {n: 0 for n in names}
    latencies = []
    while True:
        if ops is not None:
            if len(latencies) >= ops:
                break
        else:
            due += rng.exponential(1.0 / rate)
            now = time.monotonic()
            if due >= until:
                break
            if due > now:
                time.sleep(due - now)
        began = time.monotonic()
        op = names[rng.choice(len(names), p=weights)]
        if op == "get":
            blob_id = _pick(rng, db)
            row = None if blob_id is None else db.execute(
                "SELECT size, etag FROM blobs WHERE id = ?", (blob_id,)).fetchone()
            if row is not None:
                try:
                    with open(blob_path(root, blob_id), "rb") as f:
                        while f.read(1 << 20):
                            pass
                except FileNotFoundError:  # deleted by another client since the lookup
                    pass
        elif op == "put":
            size = blob_size(rng)
            blob_id = db.execute("INSERT INTO blobs (name, size, created, etag, content_type) "
                                 "VALUES ('', ?, ?, 'pending', 'application/octet-stream')",
                                 (size, time.time())).lastrowid
            _write_durably(root, blob_id, rng.bytes(size))
            db.execute("UPDATE blobs SET etag = ? WHERE id = ?", (f"{rng.integers(1 << 62):x}", blob_id))
        else:
            blob_id = _pick(rng, db)
            if blob_id is not None:
                db.execute("DELETE FROM blobs WHERE id = ?", (blob_id,))
                blob_path(root, blob_id).unlink(missing_ok=True)
        done[op] += 1
        latencies.append(time.monotonic() - began)
    db.close()
    counts.put((done, latencies))


def mixed(root: Path, duration: float, clients: int, rate: float, seed: int, ops: int | None = None,
          outcome: Path | None = None) -> dict:
    started = time.monotonic()
    until = started + duration
    counts = multiprocessing.Queue()
    share = [None] * clients if ops is None else [ops // clients + (i < ops % clients) for i in range(clients)]
    procs = [multiprocessing.Process(target=client, args=(root, until, rate / clients, seed + i, counts, share[i]))
             for i in range(clients)]
    for p in procs:
        p.start()
    # The clients' reports are read while they run: a client does not exit before its report
    # has gone through the queue's pipe (64 KiB), and thousands of latencies fill it, so
    # waiting for the clients to exit first would wait forever. A client that dies must end
    # the run, not leave the others waiting on it.
    reports = []
    while len(reports) < clients:
        if any(p.exitcode not in (None, 0) for p in procs):
            for p in procs:
                if p.is_alive():
                    p.terminate()
            for p in procs:
                p.join()
            raise SystemExit(f"a client failed: exit codes {[p.exitcode for p in procs]}")
        try:
            reports.append(counts.get(timeout=0.1))
        except queue.Empty:
            pass
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise SystemExit(f"a client failed: exit codes {[p.exitcode for p in procs]}")
    totals, latencies = {}, []
    for done, lat in reports:
        latencies += lat
        for k, v in done.items():
            totals[k] = totals.get(k, 0) + v
    elapsed = time.monotonic() - started
    if outcome is not None:
        lat = np.array(latencies) * 1e3
        outcome.write_text(json.dumps({
            "elapsed_s": elapsed, "operations": len(latencies), "by_op": totals,
            "ops_per_s": len(latencies) / elapsed if elapsed else None,
            "latency_ms": {"mean": float(lat.mean()), "p50": float(np.percentile(lat, 50)),
                           "p99": float(np.percentile(lat, 99))} if len(lat) else {},
            "unit": "operations", "reported_by": "blob_load"}))
    return totals


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="phase", required=True)
    pop = sub.add_parser("populate")
    pop.add_argument("root", type=Path)
    pop.add_argument("--mb", type=int, required=True)
    pop.add_argument("--seed", type=int, default=1)
    mix = sub.add_parser("mixed")
    mix.add_argument("root", type=Path)
    mix.add_argument("--duration", type=float, default=float("inf"))
    mix.add_argument("--ops", type=int, help="fixed work: this many operations, back to back")
    mix.add_argument("--outcome", type=Path, help="write the store's own figures here (JSON)")
    mix.add_argument("--clients", type=int, default=4)
    mix.add_argument("--rate", type=float, default=200.0)
    mix.add_argument("--seed", type=int, default=2)
    args = parser.parse_args(argv)
    if args.phase == "populate":
        populate(args.root, args.mb, args.seed)
    else:
        if args.ops is None and args.duration == float("inf"):
            parser.error("mixed needs --duration or --ops")
        totals = mixed(args.root, args.duration, args.clients, args.rate, args.seed, args.ops, args.outcome)
        print("blob load:", ", ".join(f"{k} {v}" for k, v in sorted(totals.items())), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
