"""Cached Numba kernels have one specialisation, whatever their callers pass (issue 12).

Numba's on-disk cache numbers a kernel's files per specialisation; two fresh processes
compiling different ones at once can swap them and read each other's machine code.
"""

import numpy as np
import pyarrow as pa

import analysis.characterise as ch


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
