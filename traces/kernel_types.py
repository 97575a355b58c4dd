"""The Numba types of the kernels' one explicit signature each. Numba's on-disk cache numbers a
kernel's files per specialisation: two fresh processes compiling different specialisations of
one kernel at once (read-only and writable columns, say) can point the index at the wrong
machine code. A kernel given one signature compiles that one only.

Inputs are read-only C-contiguous arrays (`ro_c`), which also take writable ones and Arrow's
zero-copy columns; outputs are writable C-contiguous arrays (`rw`), as the callers allocate
them. Callers pass contiguous columns (np.ascontiguousarray at the boundary copies only a
strided one); a strided one is a TypeError. Inputs of any layout (`ro`) cost speed, as LLVM
vectorises less and indexes through a stride: blktrace's import ran 1.3x slower on them, its
record classifier 5x, fidelity's scan 2.7x, characterise's sequential_kernel 1.3x
(bench/kernel_layout.py). synth's _continue_runs is the one kernel faster on `ro`.
"""
from numba import types

I8, I32, I64, U8, U32, U64 = types.int8, types.int32, types.int64, types.uint8, types.uint32, types.uint64
F64, BOOL = types.float64, types.boolean


def ro(dtype, ndim: int = 1):
    """A read-only array of `dtype` in any layout (strided views too)."""
    return types.Array(dtype, ndim, "A", readonly=True)


def ro_c(dtype, ndim: int = 1):
    """A read-only C-contiguous array of `dtype`: an input the kernel does not write."""
    return types.Array(dtype, ndim, "C", readonly=True)


def rw(dtype, ndim: int = 1):
    """A writable C-contiguous array of `dtype`: an output."""
    return types.Array(dtype, ndim, "C")
