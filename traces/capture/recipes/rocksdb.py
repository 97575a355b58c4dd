"""Recipe `rocksdb`: RocksDB's own benchmark, db_bench from Debian's rocksdb-tools, filling an
empty store with random keys (memtable flushes and leveled compactions) and then reading
random keys back, captured on DEVICE.

db_bench runs inside the memory cgroup with its default 8 MiB block cache and buffered
reads, so the reads of a store larger than the limit reach the device.
"""
import re

from traces.capture.recipes import timed
from traces.capture.recipes.common import GIB, MIB, Session, parse_knobs, require, version_of

DESCRIPTION = ("RocksDB's db_bench: fillrandom into an empty store (the write-ahead log, memtable "
               "flushes and leveled compactions, large sequential writes and reads), then readrandom "
               "(small random reads of the sorted tables).")

KNOBS = {
    "num": (int, 2_000_000, "Keys written per thread by fillrandom (db_bench --num)."),
    "reads": (int, 100_000, "Random reads per thread by readrandom (db_bench --reads)."),
    "threads": (int, 2, "db_bench threads, for each of the two benchmarks."),
    "value_size": (int, 400, "Bytes per value (compressed to about half with Snappy, db_bench's default)."),
    "seed": (int, 1, "db_bench --seed."),
    "memory_mb": (int, 384, "Memory cgroup limit for db_bench, MiB (its memtables and the page cache count)."),
    "fs": (str, "ext4", "Filesystem made on the device: ext4 or xfs."),
}
TOOLS = {"db_bench": "rocksdb-tools"}
# db_bench's report line per benchmark: "fillrandom : 3.618 micros/op 276370 ops/sec 7.237
# seconds 2000000 operations; ..."
_REPORT = re.compile(r"^(\w+)\s*:\s*([\d.]+) micros/op (\d+) ops/sec ([\d.]+) seconds (\d+) operations", re.M)
_COMPACTION = re.compile(r"Cumulative compaction: ([\d.]+) GB write, [\d.]+ MB/s write, ([\d.]+) GB read")


def run(device, output, *, notices, destroy_data=False, backend="auto", on_start=None, **given):
    knobs = parse_knobs(KNOBS, given)
    require(TOOLS, notices)
    with Session("rocksdb", knobs, notices) as s:
        # The store at about half the raw size, its compactions' rewrites, and room to spare.
        raw = knobs["num"] * knobs["threads"] * (knobs["value_size"] + 16)
        dev = s.device(device, destroy_data=destroy_data, scratch_size=max(2 * GIB, 2 * raw + GIB))
        mnt = s.filesystem(dev, knobs["fs"])
        s.provenance["applications"] = {"db_bench": version_of("dpkg-query", "-W", "-f", "rocksdb-tools ${Version}",
                                                               "rocksdb-tools")}
        cgroup = s.memory_cgroup(knobs["memory_mb"] * MIB)
        bench = ["db_bench", "--benchmarks=fillrandom,readrandom,stats", f"--db={mnt / 'db'}",
                 f"--num={knobs['num']}", f"--reads={knobs['reads']}", f"--threads={knobs['threads']}",
                 f"--value_size={knobs['value_size']}", f"--seed={knobs['seed']}"]
        s.provenance["workload"] = " ".join(bench).replace(str(mnt), "MOUNTPOINT")
        outcome_file = s.tmpdir / "outcome.json"

        def describe(result):
            s.provenance["outcome"] = outcome(timed.read(outcome_file))
            return (f"{DESCRIPTION} {knobs['threads']} threads, {knobs['num']} keys and {knobs['reads']} reads "
                    f"each, {knobs['value_size']}-byte values, memory limited to {knobs['memory_mb']} MiB, "
                    f"{knobs['fs']} on the device.")

        return s.capture(dev, output, command=timed.wrap(outcome_file, cgroup.wrap(bench)), backend=backend,
                         description=describe, on_start=on_start)


def outcome(recorded: dict) -> dict:
    """The application's own outcome from db_bench's report: operations, their rate and time
    per benchmark, and the compactions' bytes written and read."""
    text = recorded.get("output", "")
    benchmarks = {name: {"operations": int(ops), "ops_per_s": int(rate), "micros_per_op": float(micros),
                         "seconds": float(seconds)}
                  for name, micros, rate, seconds, ops in _REPORT.findall(text)}
    compaction = _COMPACTION.search(text)
    return timed.outcome(recorded, operations=sum(b["operations"] for b in benchmarks.values()) or None,
                         benchmarks=benchmarks,
                         compaction_gb={"write": float(compaction.group(1)), "read": float(compaction.group(2))}
                         if compaction else None,
                         unit="operations", reported_by="db_bench")
