"""The workload recipes of issue 24, each captured for real with its quick knobs on a scratch
loop device: the application's own outcome is recorded, the trace has the workload's shape
and validates, and nothing is left behind. A recipe whose Debian packages are missing skips,
naming them (`make deps` installs them).
"""
import os
import re
import signal
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tests.cli_process import replay_cli, replay_process, wait_for
from traces.capture.recipes import load
from traces.capture.recipes.common import MIB, missing_packages
from traces.schema import Op
from traces.trace import read_trace

pytestmark = [pytest.mark.root, pytest.mark.loopdev]


def recipe(name):
    """The recipe's module, or a skip naming the Debian packages it lacks."""
    module = load(name)
    lacking = missing_packages(module.TOOLS)
    if lacking:
        pytest.skip(f"recipe {name} needs the Debian package(s) {' '.join(lacking)}")
    return module


def captured(path):
    """The trace's columns, metadata and its recipe's outcome, after checking it verifies."""
    done = replay_cli("traces", "verify", path)
    assert done.returncode == 0, done.stdout + done.stderr
    columns, metadata = read_trace(path)
    outcome = metadata["recipe"]["outcome"]
    assert outcome["status"] == 0 and outcome["elapsed_s"] > 0
    assert 0 < outcome["cpu_user_s"] + outcome["cpu_system_s"]
    assert metadata["source"]["start_monotonic_ns"] < outcome["start_monotonic_ns"] < outcome["end_monotonic_ns"]
    return columns, metadata, outcome


def test_build_quick(tmp_path, clean):
    module = recipe("build")
    clean("build")
    out = tmp_path / "build.parquet"
    module.run(None, out, notices=[], targets="init/")
    cols, meta, outcome = captured(out)
    # init/ is a handful of C files; the compiler's output names each one.
    assert outcome["unit"] == "compilations" and outcome["compilations"] >= 5
    assert meta["recipe"]["applications"]["source"].startswith("linux-source-")
    assert meta["recipe"]["source_tree"]["files"] > 50_000
    reads = cols["op"] == Op.READ
    # From a cold cache, Kconfig parses every Kconfig file and the compiler reads the headers:
    # mostly small reads, by both.
    assert reads.sum() > 0.7 * np.count_nonzero(cols["op"] != Op.FLUSH)
    assert np.median(cols["length"][reads]) <= 16 * 1024
    readers = set(cols["comm"][reads])
    assert {"conf", "cc1"} <= readers, readers


def test_gitclone_quick(tmp_path, clean):
    module = recipe("gitclone")
    clean("gitclone")
    out = tmp_path / "gitclone.parquet"
    module.run(None, out, notices=[], subtree="fs")
    cols, meta, outcome = captured(out)
    repository = meta["recipe"]["repository"]
    assert repository["subtree"] == "fs" and repository["pack_bytes"] > 1 << 20
    # Every file of the commit was checked out, and git received every object of it.
    assert outcome["files"] == repository["files"] > 1000
    assert outcome["objects"] > outcome["files"]  # the blobs, plus the trees and the commit
    data = cols["op"] != Op.FLUSH
    writes = cols["op"] == Op.WRITE
    # A clone onto an empty filesystem writes: the pack, its index, the checked-out files,
    # all of it on the device by the time sync returns.
    assert writes.sum() > 0.9 * data.sum()
    assert cols["length"][writes].sum() >= repository["pack_bytes"]


def test_dpkg_quick(tmp_path, clean):
    module = recipe("dpkg")
    clean("dpkg")
    out = tmp_path / "dpkg.parquet"
    try:
        module.run(None, out, notices=[], variant="minbase")
    except module.RecipeError as exc:
        if "is it reachable" in str(exc):  # the packages are downloaded once, from the mirror
            pytest.skip(f"the Debian mirror is out of reach: {exc}")
        raise
    cols, meta, outcome = captured(out)
    assert outcome["unit"] == "packages" and outcome["packages"] > 50
    assert "(in the chroot)" in meta["recipe"]["applications"]["dpkg"]
    ops = cols["op"]
    # dpkg makes each unpacked file durable before renaming it into place: flushes are a
    # large share of the requests, and nearly everything else is a write.
    assert np.count_nonzero(ops == Op.FLUSH) > 0.2 * len(ops)
    assert np.count_nonzero(ops == Op.WRITE) > 10 * np.count_nonzero(ops == Op.READ)
    assert "dpkg" in set(cols["comm"])


def test_dpkg_interrupted_inside_the_chroot_tears_down(tmp_path, clean):
    recipe("dpkg")
    module = load("dpkg")
    out = tmp_path / "dpkg.parquet"
    with replay_process("capture", "recipe", "dpkg", "-o", out, "--variant", "minbase") as proc:
        clean("dpkg", proc.pid)
        # Once dpkg runs in the chroot, debootstrap has mounted /proc and /sys inside it.
        wait_for(proc, lambda: any("/chroot/proc" in p for p in module.mounts_under(tempfile.gettempdir())),
                 "debootstrap's /proc mount in the chroot", timeout=120)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert not out.exists()


def test_mariadb_quick(tmp_path, clean):
    module = recipe("mariadb")
    clean("mariadb")
    out = tmp_path / "mariadb.parquet"
    module.run(None, out, notices=[], tables=1, table_size=10_000, events=200, threads=4)
    cols, meta, outcome = captured(out)
    # sysbench's 18 + BEGIN, COMMIT each; a transaction retried after a deadlock adds its queries.
    assert outcome["transactions"] == 200
    if outcome["ignored_errors"] == 0:
        assert outcome["queries"] == 200 * 20
    else:
        assert outcome["queries"] > 200 * 20
    assert outcome["tps"] > 0 and outcome["latency_ms"]["95th percentile"] >= outcome["latency_ms"]["avg"] > 0
    assert "MariaDB" in meta["recipe"]["applications"]["mariadbd"]
    assert "--skip-networking" in meta["recipe"]["server_options"]
    ops = cols["op"]
    # Every commit writes and flushes InnoDB's redo log.
    assert np.count_nonzero(ops == Op.WRITE) > 0 and np.count_nonzero(ops == Op.FLUSH) > 20
    assert "mariadbd" in set(cols["comm"])


def test_rocksdb_quick(tmp_path, clean):
    module = recipe("rocksdb")
    clean("rocksdb")
    out = tmp_path / "rocksdb.parquet"
    # 2 x 150,000 values of 400 bytes: more than a 64 MiB memtable, so at least one flush.
    module.run(None, out, notices=[], num=150_000, reads=5_000)
    cols, meta, outcome = captured(out)
    bench = outcome["benchmarks"]
    assert bench["fillrandom"]["operations"] == 2 * 150_000 and bench["readrandom"]["operations"] == 2 * 5_000
    assert outcome["operations"] == 310_000 and outcome["compaction_gb"] is not None
    writes = cols["op"] == Op.WRITE
    # A memtable flush writes a sorted table in large sequential requests, from RocksDB's
    # own background thread.
    assert cols["length"][writes].max() >= 512 * 1024
    assert "rocksdb:high" in set(cols["comm"][writes])


def test_photos_quick(tmp_path, clean):
    module = recipe("photos")
    clean("photos")
    out = tmp_path / "photos.parquet"
    module.run(None, out, notices=[], photos=4)
    cols, meta, outcome = captured(out)
    photos = meta["recipe"]["photos"]
    assert outcome["unit"] == "photos" and outcome["photos"] == outcome["previews"] == 4
    assert (photos["width"], photos["height"]) == (6000, 4000) and photos["bytes"] > 4 * 2 * MIB
    assert "ImageMagick" in meta["recipe"]["applications"]["imagemagick"]
    ops, length = cols["op"], cols["length"]
    reads, writes = ops == Op.READ, ops == Op.WRITE
    # The import reads every photo from the device, cold, and writes far fewer bytes back:
    # a preview and a thumbnail are a small fraction of a 24 MP JPEG.
    assert length[reads].sum() >= photos["bytes"]
    assert 0 < length[writes].sum() < 0.5 * length[reads].sum()
    assert "convert-im6.q16" in set(cols["comm"][reads]) or "convert-im7.q16" in set(cols["comm"][reads])


def test_video_quick(tmp_path, clean):
    module = recipe("video")
    clean("video")
    out = tmp_path / "video.parquet"
    module.run(None, out, notices=[], seconds=4)
    cols, meta, outcome = captured(out)
    source = meta["recipe"]["source_video"]
    assert (source["width"], source["height"]) == (1920, 1080) and source["bytes"] > 4 * 2 * MIB
    # ffmpeg says it encoded every frame of the source, and the export is on the filesystem.
    assert outcome["unit"] == "frames" and outcome["frames"] == source["frames"] == 4 * 30
    assert 0 < outcome["output_bytes"] < source["bytes"]
    assert "ffmpeg version" in meta["recipe"]["applications"]["ffmpeg"]
    ops, length = cols["op"], cols["length"]
    reads, writes = ops == Op.READ, ops == Op.WRITE
    # The export reads the whole source from the device, cold, and writes the smaller H.264 file.
    assert length[reads].sum() >= source["bytes"]
    assert length[writes].sum() >= outcome["output_bytes"]
    assert length[writes].sum() < length[reads].sum()
    assert any(comm.startswith("ffmpeg") for comm in set(cols["comm"][reads]))


def test_office_quick(tmp_path, clean):
    module = recipe("office")
    clean("office")
    out = tmp_path / "office.parquet"
    module.run(None, out, notices=[], documents=6)
    cols, meta, outcome = captured(out)
    install, documents = meta["recipe"]["installation"], meta["recipe"]["documents"]
    assert documents == {"files": 6, "bytes": documents["bytes"], "text": 2, "web": 2, "sheet": 2}
    # Every document converted: texts and web pages to PDF in the first launch, sheets to XLSX.
    assert outcome["unit"] == "documents" and (outcome["documents"], outcome["pdf"], outcome["xlsx"]) == (6, 4, 2)
    assert meta["recipe"]["applications"]["libreoffice"].startswith("LibreOffice ")
    # The copy holds the program, its libraries (libc among them) and fonts: hundreds of MiB.
    assert install["bytes"] > 100 * MIB and install["libraries"] > 20 and install["fonts"] > 0
    ops, length = cols["op"], cols["length"]
    reads, writes = ops == Op.READ, ops == Op.WRITE
    # A cold launch reads much of the installation from the device (the documents are a small
    # part), and writes far less: the PDFs, spreadsheets and the profile's changes.
    assert length[reads].sum() > 0.2 * install["bytes"] > 10 * documents["bytes"]
    assert 0 < length[writes].sum() < 0.2 * length[reads].sum()
    assert "soffice.bin" in set(cols["comm"][reads])


def nginx_listeners(tag):
    """The addresses that nginx processes whose command line holds `tag` listen on, as `ss`
    sees them."""
    found = set()
    for line in subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout.splitlines():
        for pid in re.findall(r'"nginx",pid=(\d+)', line):
            try:
                if tag.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.add(line.split()[3])
            except OSError:
                pass
    return found


def test_web_quick(tmp_path, clean):
    module = recipe("web")
    if missing_packages({"ss": "iproute2"}):
        pytest.skip("the web recipe's test needs ss, from the Debian package iproute2")
    clean("web")
    out = tmp_path / "web.parquet"
    seen = []
    module.run(None, out, notices=[], files=500, requests=3000, memory_mb=16,
               on_start=lambda _backend: seen.append(nginx_listeners(f"tracereplay-web-{os.getpid()}-")))
    cols, meta, outcome = captured(out)
    # Our nginx was serving when the capture began, on one loopback address only.
    port = meta["recipe"]["server"]["listening"][0].rsplit(":", 1)[1]
    assert seen == [{f"127.0.0.1:{port}"}]
    assert outcome["unit"] == "requests" and outcome["requests"] == outcome["logged_requests"] == 3000
    assert outcome["errors"] == 0 and outcome["bytes"] > 3000 * 256
    assert "nginx" in meta["recipe"]["applications"]["nginx"]
    tree = meta["recipe"]["tree"]
    assert tree["files"] == 500 and tree["bytes"] > 16 * MIB
    ops, length = cols["op"], cols["length"]
    reads = ops == Op.READ
    # Served cold from a tree larger than the cgroup: nginx reads files from the device, in
    # requests no larger than its files, and far fewer bytes than it sent (popular files hit
    # the cache); the access log reaches the device by the closing sync.
    assert set(cols["comm"][reads]) >= {"nginx"} and reads.sum() > 0.9 * np.count_nonzero(ops != Op.FLUSH)
    assert 0 < length[reads].sum() < outcome["bytes"]
    assert np.median(length[reads]) <= 256 * 1024
    assert np.count_nonzero(ops == Op.WRITE) > 0


def test_blobclosed_quick(tmp_path, clean):
    module = recipe("blobclosed")
    clean("blobclosed")
    out = tmp_path / "blobclosed.parquet"
    module.run(None, out, notices=[], ops=120, populate_mb=256, clients=2, memory_mb=128)
    cols, meta, outcome = captured(out)
    recipe_meta = meta["recipe"]
    assert recipe_meta["recipe"] == meta["source"]["recipe"] == "blobclosed"
    assert recipe_meta["knobs"]["ops"] == 120 and "--ops 120" in recipe_meta["workload"]
    assert "--rate" not in recipe_meta["workload"] and "closed-loop" in meta["description"]
    # The store's own count: every operation ran, back to back, each with its latency.
    assert outcome["unit"] == "operations" and outcome["operations"] == sum(outcome["by_op"].values()) == 120
    assert outcome["latency_ms"]["p99"] >= outcome["latency_ms"]["p50"] > 0
    assert outcome["elapsed_s"] >= outcome["store_elapsed_s"] > 0
    # Closed loop: the clients wait for nothing but their own operations, so the store's time
    # is the operations' latencies shared by the clients, not a schedule's.
    busy_s = outcome["latency_ms"]["mean"] * 120 / 1e3 / 2
    assert outcome["store_elapsed_s"] < 1.5 * busy_s + 1.0
    ops, length = cols["op"], cols["length"]
    # GETs read blob bodies cold (64 KiB and more); PUTs are made durable.
    assert np.count_nonzero(ops == Op.FLUSH) > 0 and np.count_nonzero(ops == Op.WRITE) > 0
    assert length[ops == Op.READ].max() >= 64 * 1024
