"""Shared pieces of the benchmarks: running one replay in a fresh subprocess (so its CPU time
and peak RSS are its own), running fio with its rusage, writing traces, printing tables.

`python bench/_harness.py worker ...` is the subprocess side: it calls the library's
`replay(...)` and prints one JSON line of what it measured.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


# ---- the replay subprocess ------------------------------------------------------------------

def _threads_cpu_ns(names=False) -> dict:
    """CPU ns so far of each live thread of this process (schedstat: ns, the same sum the
    process CPU clock adds up); with `names`, tid -> (comm, ns)."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            ns = int((task / "schedstat").read_text().split()[0])
            out[int(task.name)] = ((task / "comm").read_text().strip(), ns) if names else ns
        except (OSError, ValueError):
            pass
    return out


class _Sampler(threading.Thread):
    """With --threads: samples every thread's CPU every 5 ms, so the last figure of a thread
    that has exited (io_uring's io-wq workers) is known to within 5 ms of CPU. Its wake-ups
    perturb the run, so it is off unless asked for."""

    def __init__(self):
        super().__init__(daemon=True)
        self.last, self.done, self.own_ns = {}, threading.Event(), 0

    def run(self):
        while not self.done.wait(0.005):
            self.last.update(_threads_cpu_ns(names=True))
        # Its own CPU (reading /proc for every thread 200 times a second) is the harness's,
        # not the replay's: the worker takes it out of the process figure.
        self.own_ns = time.thread_time_ns()


def _by_name(sampled: dict, before: dict) -> dict:
    """CPU seconds per thread name (io-wq workers are all iou-wrk-PID) from a sampler's last
    figures, less what each thread had used before the run."""
    out = {}
    for tid, (comm, ns) in sampled.items():
        name = "iou-wrk" if comm.startswith("iou-wrk") else comm
        out[name] = out.get(name, 0) + (ns - before.get(tid, 0)) / 1e9
    return {k: round(v, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def _worker(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--trace", required=True)
    p.add_argument("--target")
    p.add_argument("--output", required=True)
    p.add_argument("--engine")
    p.add_argument("--afap", action="store_true")
    p.add_argument("--qd", type=int, default=32)
    p.add_argument("--speed", type=float, default=1.0)
    p.add_argument("--max-inflight", type=int, default=1024)
    p.add_argument("--threads", action="store_true", help="sample every thread's CPU every 5 ms")
    a = p.parse_args(argv)

    from replay.runner import RunOptions, replay  # imports (numba, pyarrow) stay out of the window

    opts = RunOptions(timing="afap" if a.afap else "original", qd=a.qd, speed=a.speed, engine=a.engine,
                      max_inflight=a.max_inflight, destroy_data=True)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sampler = _Sampler()
    if a.threads:
        sampler.start()
    threads0, cpu0 = _threads_cpu_ns(), time.process_time_ns()
    t0, w0 = os.times(), time.perf_counter()
    out = replay(a.trace, a.target, opts, output=a.output)
    t1, w1 = os.times(), time.perf_counter()
    cpu1, threads1 = time.process_time_ns(), _threads_cpu_ns()
    if a.threads:
        sampler.done.set()
        sampler.join()
    # The engine thread has exited by now, and an exited thread's CPU stays in the process
    # clock: the engine reports its own; the dead rest are its helper threads.
    live_ns = sum(ns - threads0.get(tid, 0) for tid, ns in threads1.items())
    s = out.summary
    print(json.dumps({
        "ios": out.rows,
        "iops": s.iops(),
        "duration_s": s.duration_ns / 1e9,
        "wall_s": w1 - w0,
        "process_cpu_s": (cpu1 - cpu0 - sampler.own_ns) / 1e9,  # the sampler's own CPU taken out
        "process_user_s": t1.user - t0.user,
        "process_sys_s": t1.system - t0.system,
        "engine": out.engine,
        "engine_cpu_s": out.engine_cpu_s,  # the engine thread alone, as it measured itself
        # io_uring's io-wq workers or psync's I/O threads
        "helpers_cpu_s": (cpu1 - cpu0 - live_ns) / 1e9 - out.engine_cpu_s,
        "threads_cpu_s": _by_name(sampler.last, threads0),  # with --threads: per thread name
        "maxrss_before_kib": rss_before,
        "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "errors": s.total().errors,
        "notices": out.notices,
        "output": str(out.output),
    }))


def _engine_alone(argv):
    """The engine as `replay run --afap` starts it (the same engine, depth and opening of the
    target: `start_engines`), fed the trace from memory in the runner's chunks, each chunk's
    results taken and dropped: what the engine does without the runner's work beside it
    (reading the trace, the results journal, the summary). Prints one JSON line."""
    p = argparse.ArgumentParser()
    p.add_argument("--trace", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--engine")
    p.add_argument("--qd", type=int, default=32)
    a = p.parse_args(argv)

    import pyarrow.parquet as pq

    from replay.engines import start_engines, start_together
    from replay.options import RunOptions
    from traces.schema import Op
    from traces.targets import inspect_target

    names = ("ts_ns", "op", "offset", "length")
    t = pq.read_table(a.trace, columns=list(names))
    cols = [t[name].to_numpy().astype(np.uint8 if name == "op" else np.int64) for name in names]
    opts = RunOptions(timing="afap", qd=a.qd, engine=a.engine, destroy_data=True)
    cpu0 = time.process_time_ns()
    (rep,), engine, _ = start_engines(inspect_target(a.target), opts, bool((cols[1] == Op.WRITE).any()),
                                      int(cols[3].max()), [])
    start_together([rep])
    first, last, ios = [], [], 0

    def keep(got):
        nonlocal ios
        _, issue, complete, _, issued = got
        if issued:
            first.append(issue[:issued].min())
            last.append(complete[:issued].max())
            ios += issued

    n, step = len(cols[0]), opts.chunk_rows
    for i in range(0, n, step):
        rep.push(*(c[i:i + step] for c in cols))
        while (got := rep.take(False)) is not None:
            keep(got)
    rep.close()
    while (got := rep.take(True)) is not None:
        keep(got)
    stats = rep.join()
    duration_ns = max(last) - min(first)
    print(json.dumps({"ios": ios, "iops": ios / duration_ns * 1e9, "duration_s": duration_ns / 1e9,
                      "engine": engine, "engine_cpu_s": stats["cpu_ns"] / 1e9,
                      "process_cpu_s": (time.process_time_ns() - cpu0) / 1e9}))


def _child_env(pythonpath=None) -> dict:
    """A child's environment, OPENBLAS_NUM_THREADS=1 as the `replay` CLI sets it (OpenBLAS's idle
    threads would spin on the engine's cores); `pythonpath`, another checkout's tracereplay
    (afap_ab.py)."""
    return {**os.environ, "OPENBLAS_NUM_THREADS": "1", **({"PYTHONPATH": pythonpath} if pythonpath else {})}


def run_engine_alone(trace, target, *, engine=None, qd=32) -> dict:
    """`_engine_alone` in a fresh Python process; returns its JSON line."""
    cmd = [sys.executable, str(HERE / "_harness.py"), "engine-alone", "--trace", str(trace),
           "--target", str(target), "--qd", str(qd), *(["--engine", engine] if engine else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent, env=_child_env())
    if proc.returncode:
        raise RuntimeError(f"engine-alone worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_ours(trace, target, output, *, engine=None, afap=True, qd=32, speed=1.0,
             max_inflight=1024, keep_output=False, threads=False, pythonpath=None) -> dict:
    """One replay in a fresh Python process; returns the worker's JSON plus `child_cpu_s`
    (rusage of the whole child, interpreter start and imports included). With `threads`,
    `threads_cpu_s` has each thread name's CPU, sampled every 5 ms (which perturbs the run).
    `pythonpath`: the child's PYTHONPATH (another checkout's tracereplay, afap_ab.py)."""
    cmd = [sys.executable, str(HERE / "_harness.py"), "worker", "--trace", str(trace),
           "--output", str(output), "--qd", str(qd), "--speed", str(speed),
           "--max-inflight", str(max_inflight)]
    if target:
        cmd += ["--target", str(target)]
    if engine:
        cmd += ["--engine", engine]
    if afap:
        cmd.append("--afap")
    if threads:
        cmd.append("--threads")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent, env=_child_env(pythonpath))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise RuntimeError(f"replay worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["child_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if not keep_output:
        Path(output).unlink(missing_ok=True)
    return res


# ---- fio ----------------------------------------------------------------------------------

def run_fio(args: list[str]) -> dict:
    """Run fio with --output-format=json; returns its first job plus `child_cpu_s` (rusage of
    fio and its job processes), and, over all its jobs (--numjobs), `job_cpu_s` (each job's
    usr_cpu + sys_cpu % x its runtime, summed), `ios` (summed) and `iops`: all the jobs' I/Os
    over the longest job's time, as fio's group_reporting counts them and as our IOPS is every
    I/O over the run's window. (The sum of the jobs' own IOPS, `iops_sum_of_jobs`, counts a job
    that finished early at its own rate: 3 % above the aggregate in a quiet psync x2 run on
    zram, more when the jobs' times differ.)"""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0 = time.perf_counter()
    proc = subprocess.run(["fio", *args, "--output-format=json"], capture_output=True, text=True)
    wall = time.perf_counter() - w0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise RuntimeError(f"fio failed ({proc.returncode}): {' '.join(args)}\n{proc.stderr[-3000:]}")
    text = proc.stdout[proc.stdout.index("{"):]  # fio may print notes before the JSON
    jobs = json.loads(text)["jobs"]
    job = jobs[0]
    job["child_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    job["job_cpu_s"] = sum((j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] / 1e3 for j in jobs)
    dirs = ("read", "write", "trim")
    job["ios"] = sum(j[d]["total_ios"] for j in jobs for d in dirs)
    job["iops_sum_of_jobs"] = sum(j[d]["iops"] for j in jobs for d in dirs)
    # The longest job's time (ms, fio's own runtime of each direction, which its IOPS divide by).
    seconds = max((j[d]["runtime"] for j in jobs for d in dirs if j[d]["total_ios"]), default=0) / 1e3
    job["iops"] = job["ios"] / seconds if seconds > 0 else job["iops_sum_of_jobs"]
    job["numjobs"] = len(jobs)
    job["wall_s"] = wall
    return job


# ---- the floor (floor.c) ------------------------------------------------------------------

FLOOR_RECORD = np.dtype([("ts_ns", "<i8"), ("offset", "<i8"), ("length", "<u4"), ("op", "<u4")])


def build_floor(directory) -> Path:
    """Compile floor.c into `directory` with the system's cc (liburing-dev needed); returns
    the binary."""
    out = Path(directory, "floor")
    subprocess.run(["cc", "-O2", "-o", str(out), str(HERE / "floor.c"), "-luring", "-lpthread"],
                   check=True, capture_output=True, text=True)
    return out


def write_floor_trace(path, ts_ns, offset, length, op) -> Path:
    """The trace as floor.c reads it: packed little-endian records (ts_ns, offset, length, op)."""
    rec = np.empty(len(ts_ns), FLOOR_RECORD)
    rec["ts_ns"], rec["offset"], rec["length"], rec["op"] = ts_ns, offset, length, op
    rec.tofile(path)
    return Path(path)


def run_floor(binary, mode: str, dev, trace, arg, *extra) -> dict:
    """One floor run (`mode` timed, psync or uring; `arg` the lateness output file, threads
    or queue depth; `extra`, timed's SLEEP_NS); returns its JSON line (ios, seconds, iops,
    cpu_s)."""
    proc = subprocess.run([str(binary), mode, str(dev), str(trace), str(arg), *map(str, extra)],
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"floor {mode} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- traces -------------------------------------------------------------------------------

def random_trace(path, n, span, *, read_share=1.0, ts_ns=None, seed=1, bs=4096):
    """A trace of `n` `bs`-byte I/Os at uniformly random `bs`-aligned offsets below `span`;
    reads with probability `read_share`, else writes. `ts_ns` defaults to 0, 1, 2, ..."""
    from traces.schema import Op
    from traces.trace import write_trace

    rng = np.random.default_rng(seed)
    offset = rng.integers(0, span // bs, n, dtype=np.int64) * bs
    op = np.where(rng.random(n) < read_share, Op.READ, Op.WRITE).astype(np.uint8)
    ts = np.arange(n, dtype=np.int64) if ts_ns is None else ts_ns
    write_trace(path, {"ts_ns": ts, "op": op, "offset": offset,
                       "length": np.full(n, bs, dtype=np.int64)},
                {"name": Path(path).stem, "description": "benchmark trace"})
    return path


# ---- output -------------------------------------------------------------------------------

def parser(doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes, finishes in about a minute")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    return p


def table(headers: list[str], rows: list[list]) -> str:
    cells = [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def _fmt(x):
    if isinstance(x, float):
        if x != x:
            return "-"
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        if abs(x) >= 10:
            return f"{x:.1f}"
        return f"{x:.3f}" if abs(x) < 1 else f"{x:.2f}"
    return str(x)


def write_json(path, data):
    if path:
        Path(path).write_text(json.dumps(data, indent=2, default=float) + "\n")
        print(f"figures written to {path}")


def machine() -> dict:
    return {"nproc": os.cpu_count(), "kernel": os.uname().release,
            "fio": subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "worker":
    _worker(sys.argv[2:])
elif __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "engine-alone":
    _engine_alone(sys.argv[2:])


def timed_import(src: Path, out: Path, fmt: str) -> dict:
    """Import `src` as `fmt` into `out` in a child process of its own (ru_maxrss of
    RUSAGE_CHILDREN is the peak over all children, so each import reports its own peak)."""
    code = ("import resource, time; from traces.convert import import_trace; t = time.monotonic(); "
            f"rows = import_trace([{str(src)!r}], {str(out)!r}, {fmt!r}, force=True)[1]; "
            "print(rows, time.monotonic() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], env=_child_env())
    if done.returncode:
        sys.exit(done.stderr)
    rows, seconds, rss_kib = done.stdout.split()
    rows, seconds = int(rows), float(seconds)
    return {"records": rows, "seconds": seconds, "records_per_s": rows / seconds,
            "peak_rss_mib": int(rss_kib) / 1024}
