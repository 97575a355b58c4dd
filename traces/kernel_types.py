"""The Numba types of the kernels' one explicit signature each. Numba's on-disk cache numbers a
kernel's files per specialisation: two fresh processes compiling different specialisations of
one kernel at once (read-only and writable columns, say) can point the index at the wrong
machine code. A kernel given one signature compiles that one only.

Inputs are read-only arrays of any layout (`ro`), which also take writable ones and Arrow's
zero-copy columns; outputs are writable C-contiguous arrays (`rw`), as the callers allocate
them. A kernel whose loops LLVM vectorises only over contiguous data takes read-only
C-contiguous inputs (`ro_c`), and its callers pass contiguous columns (a strided one is a
TypeError): blktrace's import ran 1.3x slower on `ro` inputs, its record classifier 5x.
"""
from numba import types

I8, I32, I64, U8, U32, U64 = types.int8, types.int32, types.int64, types.uint8, types.uint32, types.uint64
F64, BOOL = types.float64, types.boolean


def ro(dtype, ndim: int = 1):
    """A read-only array of `dtype`: an input the kernel does not write."""
    return types.Array(dtype, ndim, "A", readonly=True)


def ro_c(dtype, ndim: int = 1):
    """A read-only C-contiguous array of `dtype`: an input of a loop that vectorises."""
    return types.Array(dtype, ndim, "C", readonly=True)


def rw(dtype, ndim: int = 1):
    """A writable C-contiguous array of `dtype`: an output."""
    return types.Array(dtype, ndim, "C")
