"""Cached Numba kernels have one specialisation, whatever their callers pass (issue 12).

Numba's on-disk cache numbers a kernel's files per specialisation; two fresh processes
compiling different ones at once can swap them and read each other's machine code.
"""

import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

import analysis.characterise as ch

REPO = Path(__file__).resolve().parents[2]


def test_reuse_kernel_has_one_signature_for_writable_and_read_only_columns():
    results = []
    for writable in (True, False):
        offset = np.arange(100, dtype=np.int64) << 12
        length = np.full(100, 4096, np.int64)
        offset.flags.writeable = length.flags.writeable = writable
        last = ch.Dict.empty(ch.types.int64, ch.types.int64)
        tree = np.zeros(64, np.int64)
        state = np.array([0, 1 << ch.SHARDS_BITS, 16, 0, -1, 0], np.int64)
        hist = np.zeros(ch.N_BINS, np.int64)
        ch.reuse_kernel(offset, length, 12, last, tree, state, hist)
        results.append((state.tolist(), hist.tolist()))
    assert results[0] == results[1]
    # Arrow's zero-copy columns are read-only too.
    col = pa.array(np.arange(10, dtype=np.int64)).to_numpy()
    assert not col.flags.writeable
    assert len(ch.reuse_kernel.signatures) == 1


def _cached_kernels():
    """(name, dispatcher) of every Numba kernel with an on-disk cache in our packages."""
    from numba.core.dispatcher import Dispatcher

    for package in PACKAGES:
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
            try:
                module = importlib.import_module(info.name)
            except ImportError:  # an optional extra (Ray, DuckDB) is missing
                continue
            for name, value in vars(module).items():
                if (isinstance(value, Dispatcher) and value.py_func.__module__ == info.name
                        and type(value._cache).__name__ != "NullCache"):
                    yield f"{info.name}.{name}", value


PACKAGES = ("traces", "synth", "analysis", "replay")


def test_every_cached_kernel_compiles_one_explicit_signature():
    kernels = dict(_cached_kernels())
    assert len(kernels) >= 30
    lazy = sorted(name for name, k in kernels.items() if k._can_compile or len(k.signatures) != 1)
    assert not lazy, f"kernels without one explicit signature: {', '.join(lazy)}"


FRESH = """
import numpy as np
from analysis import characterise, fidelity, histogram
from synth import generators
rng = np.random.default_rng(5)
n = 20000
offset, length = rng.integers(0, 1 << 20, n) << 12, np.full(n, 4096, np.int64)
offset.flags.writeable = False
counts = np.zeros(2, np.int64)
characterise.sequential_kernel(rng.integers(0, 2, n).astype(np.uint8), offset, length,
                               np.full(4, -1, np.int64), counts)
h = histogram.LatencyHistogram()
h.add(rng.integers(1, 10**9, n))
print(counts.tolist(), [int(h.percentile(q)) for q in (50, 99, 99.9)])
"""


def test_two_fresh_processes_compiling_at_once_agree_and_a_third_reads_their_cache(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    both = [subprocess.Popen([sys.executable, "-c", FRESH], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env, cwd=tmp_path) for _ in range(2)]
    said = [p.communicate(timeout=600) for p in both]
    assert [p.returncode for p in both] == [0, 0], [err[-2000:] for _, err in said]
    assert said[0][0] == said[1][0] and said[0][0].strip()
    assert any((tmp_path / "cache").rglob("*.nbi"))  # the kernels were cached there
    third = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=600)
    assert third.returncode == 0 and third.stdout == said[0][0], third.stderr[-2000:]
