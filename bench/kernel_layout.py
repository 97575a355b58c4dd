"""Input layout of the Numba kernels: each kernel compiled with read-only C-contiguous inputs
(traces.kernel_types.ro_c) against the same kernel compiled with read-only inputs of any layout
("A", kernel_types.ro), its outputs as in its own signature, in one process on the same
arguments; "has" says which of the two its own signature is.

The arguments are recorded from the kernels' real callers on synthetic data of --rows rows (a
results file shaped as bench/analysis_speed.py's, a causal annotation, the two synthetic
mixes, capture's matching, a ring buffer of tracefs pages): each kernel's largest call is kept.
Both variants are compiled afresh, without a cache, and called alternately (A C, C A, ...) on
those inputs and fresh copies of the outputs; a row gives the length of the kernel's first array (n),
each variant's median over --calls calls, and "A/C" their ratio (above 1: the C signature is
faster). The outputs of the two are checked equal. On a shared machine compare the ratios, not
the absolute times.
"""
import sys
import tempfile
import time
from pathlib import Path

import numba
import numpy as np
from numba import types
from numba.typed import Dict, List

from _harness import machine, parser, table, write_json
from traces.kernel_types import ro, ro_c

HERE = Path(__file__).resolve().parent

KERNELS = {
    "analysis.characterise": ("sequential_kernel", "qd_kernel", "mark_blocks", "hll_kernel",
                              "stamp_blocks", "reuse_kernel"),
    "analysis.timeseries": ("_accumulate", "_percentiles"),
    "analysis.compare": ("_window_kernel", "_hist_percentile"),
    "analysis.causal_kernel": ("annotate_kernel",),
    "analysis.scoring": ("_bin_rows",),
    "analysis.fidelity": ("_signed_add", "inflight_at_starts", "count_reordered", "_scan", "_gaps"),
    "analysis.summary": ("_scan", "_accumulate"),
    "analysis.histogram": ("_add_kernel",),
    "synth.generators": ("_continue_runs", "_stream_offsets"),
    "traces.capture.records": ("match_fifo", "last_before"),
    "traces.capture.tracefs": ("walk_pages",),
}


def _copy(x):
    if isinstance(x, np.ndarray):
        y = x.copy()
        y.flags.writeable = x.flags.writeable
        return y
    if isinstance(x, Dict):
        y = Dict.empty(x._dict_type.key_type, x._dict_type.value_type)
        for k, v in x.items():
            y[k] = v
        return y
    if isinstance(x, List):
        y = List.empty_list(x._list_type.item_type)
        for v in x:
            y.append(v)
        return y
    return x


def _size(args):
    return sum(a.size for a in args if isinstance(a, np.ndarray))


class Recorder:
    """Stands in for a kernel in its module and keeps a copy of the arguments of its largest call."""

    def __init__(self, kernel):
        self.kernel, self.args = kernel, None

    def __call__(self, *args):
        if self.args is None or _size(args) > _size(self.args):
            self.args = tuple(_copy(a) for a in args)
        return self.kernel(*args)


def record(rows: int, directory: Path) -> dict:
    """Run the kernels' callers on synthetic data; {(module, name): (dispatcher, args)}."""
    import importlib

    recorders = {}
    for module_name, names in KERNELS.items():
        module = importlib.import_module(module_name)
        for name in names:
            recorders[module_name, name] = Recorder(getattr(module, name))
            setattr(module, name, recorders[module_name, name])
    try:
        _workloads(rows, directory)
    finally:
        for (module_name, name), r in recorders.items():
            setattr(importlib.import_module(module_name), name, r.kernel)
    missing = [f"{m}.{n}" for (m, n), r in recorders.items() if r.args is None]
    if missing:
        raise SystemExit(f"no call recorded for {', '.join(missing)}")
    return {key: (r.kernel, r.args) for key, r in recorders.items()}


def _workloads(rows, directory):
    sys.path.insert(0, str(HERE))
    from analysis_speed import make_results

    from analysis import causal, compare
    from analysis.analyse import analyse
    from analysis.characterise import characterise
    from analysis.results import load
    from analysis.scoring import Bins
    from synth.generators import random_mix, sequential_mix
    from traces.capture import records, tracefs
    from traces.schema import Op
    from traces.trace import open_trace

    path = make_results(directory / "results.parquet", rows)
    r = load(path)
    analyse(r)  # time series, fidelity, summary, histograms
    columns = ["op", "length", "intended_ns", "issue_ns", "complete_ns", "result"]
    Bins.from_chunks(r.chunks(columns, rows=1 << 20), thresholds_ns=(100_000, 1_000_000))
    compare._bootstrap(r, compare._point_metrics(r))
    characterise(open_trace(path), rows=1 << 20)  # per-window working sets by HyperLogLog
    characterise(open_trace(path), rows=1 << 20, max_stamp_blocks=1 << 27)  # by stamps

    rng = np.random.default_rng(2)
    ts = np.cumsum(rng.exponential(10_000, rows)).astype(np.int64)
    causal.annotate({"ts_ns": ts, "op": rng.choice([Op.READ, Op.WRITE, Op.FLUSH], rows).astype(np.uint8),
                     "latency_ns": rng.lognormal(np.log(90_000), 0.6, rows).astype(np.int64),
                     "pid": rng.integers(1, 64, rows), "flags": np.zeros(rows, np.uint8)})
    for mix in (random_mix(sequential_share=0.5, count=rows), sequential_mix(streams=4, count=rows)):
        for _ in mix.chunks(rows):
            pass

    # Capture's matching as traces.capture.records.build sorts it: issues and completions of
    # the same (sector, size) keys, completions after their issues.
    sector = rng.integers(0, rows // 4, rows) * 8
    nr = np.full(rows, 8, np.int64)
    key_a, key_b = np.concatenate([sector, sector]), np.concatenate([nr, nr])
    t = np.concatenate([ts, ts + 90_000])
    is_c = np.concatenate([np.zeros(rows, bool), np.ones(rows, bool)])
    order = np.lexsort((is_c, t, key_b, key_a))
    records.match_fifo(key_a[order], key_b[order], is_c[order])
    order = np.lexsort((is_c, t, key_a))
    records.last_before(key_a[order], is_c[order])

    # Ring-buffer pages of 16-byte events (type_len 4), as the kernel writes them.
    layout, header = tracefs.PageLayout(4096, 0, 8, 8, 16), tracefs.EventHeader()
    per_page = (layout.page_size - layout.data_offset) // 20
    pages = -(-rows // per_page)
    buf = np.zeros((pages, layout.page_size), np.uint8)
    words = np.full(per_page, 4 | (1000 << 5), np.uint32).view(np.uint8).reshape(per_page, 4)
    body = np.zeros((per_page, 20), np.uint8)
    body[:, :4] = words
    body[:, 4:] = rng.integers(0, 256, (per_page, 16), dtype=np.uint8)
    buf[:, 16:16 + per_page * 20] = body.reshape(-1)
    buf[:, 0:8] = np.arange(pages, dtype=np.uint64).view(np.uint8).reshape(pages, 8)  # page ts
    buf[:, 8:16] = np.full(pages, per_page * 20, np.uint64).view(np.uint8).reshape(pages, 8)
    tracefs.walk(buf.reshape(-1), layout, header)


def _inputs(sig, helper):
    """The signature with its read-only inputs made by `helper` (kernel_types.ro or ro_c)."""
    return tuple(helper(a.dtype, a.ndim) if isinstance(a, types.Array) and not a.mutable else a
                 for a in sig)


# walk_pages returns arrays of a capacity, filled up to its fourth output.
TRIM = {"traces.capture.tracefs.walk_pages": lambda out: (*(a[:out[3]] for a in out[:3]), *out[3:])}
# Outputs above this are reused from call to call rather than copied afresh: the kernels only
# add to them, and copying hundreds of MB per call would time the copy's effect on the caches.
COPY_MAX_BYTES = 16 << 20


def _fresh(args, sig):
    """Arguments for one call: the read-only inputs as recorded, copies of what it writes."""
    return tuple(a if isinstance(t, types.Array) and not t.mutable
                 or isinstance(a, np.ndarray) and a.nbytes > COPY_MAX_BYTES else _copy(a)
                 for a, t in zip(args, sig))


def _same(a, b):
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (Dict, List)):
        return list(a.items() if isinstance(a, Dict) else a) == list(b.items() if isinstance(b, Dict) else b)
    return a == b or (a != a and b != b)


def measure(key, kernel, args, calls: int) -> dict:
    sig_c, sig_a = _inputs(kernel.signatures[0], ro_c), _inputs(kernel.signatures[0], ro)
    has = {tuple(sig_c): "C", tuple(sig_a): "A"}.get(tuple(kernel.signatures[0]), "mixed")
    options = {k: v for k, v in kernel.targetoptions.items() if k not in ("cache", "nopython")}
    variants = {"C": numba.njit(sig_c, **options)(kernel.py_func),
                "A": numba.njit(sig_a, **options)(kernel.py_func)}
    outputs = {}
    for name, f in variants.items():
        fresh = tuple(_copy(a) for a in args)
        outputs[name] = (TRIM.get(key, lambda out: out)(f(*fresh)), fresh)
    same = _same(outputs["C"][0], outputs["A"][0]) and all(
        _same(x, y) for x, y in zip(outputs["C"][1], outputs["A"][1]))
    times = {"C": [], "A": []}
    for i in range(calls):
        for name in ("C", "A") if i % 2 else ("A", "C"):
            fresh = _fresh(args, sig_c)
            t0 = time.perf_counter_ns()
            variants[name](*fresh)
            times[name].append(time.perf_counter_ns() - t0)
    first = next(a for a in args if isinstance(a, np.ndarray))
    a_ns, c_ns = (float(np.median(times[k])) for k in ("A", "C"))
    return {"n": int(first.shape[0]), "A_ms": a_ns / 1e6, "C_ms": c_ns / 1e6, "ratio": a_ns / c_ns,
            "same_outputs": bool(same), "signature": has}


def main():
    p = parser(__doc__)
    p.add_argument("--rows", type=int, help="rows of the synthetic data (default 2M, quick 200k)")
    p.add_argument("--calls", type=int, default=25, help="calls of each variant (median; default 25)")
    p.add_argument("--only", nargs="+", help="module.kernel names to measure (default: all)")
    args = p.parse_args()
    rows = args.rows or (200_000 if args.quick else 2_000_000)
    with tempfile.TemporaryDirectory(prefix="tracereplay-layout-") as tmp:
        recorded = record(rows, Path(tmp))
    out, lines = [], []
    for (module, name), (kernel, kargs) in recorded.items():
        key = f"{module}.{name}"
        if args.only and key not in args.only:
            continue
        m = {"kernel": key, **measure(key, kernel, kargs, args.calls)}
        out.append(m)
        lines.append([key, m["n"], f"{m['A_ms']:.3f}", f"{m['C_ms']:.3f}", f"{m['ratio']:.3f}",
                      "yes" if m["same_outputs"] else "NO", m["signature"]])
        print(table(["kernel", "n", "A ms", "C ms", "A/C", "same", "has"], lines[-1:]).splitlines()[-1],
              flush=True)
    print(table(["kernel", "n", "A ms", "C ms", "A/C", "same", "has"], lines))
    if args.json:
        write_json(args.json, {"machine": machine(), "rows": rows, "calls": args.calls, "kernels": out})
    if not all(m["same_outputs"] for m in out):
        raise SystemExit("the two layouts disagree on some kernel's outputs")


if __name__ == "__main__":
    main()
