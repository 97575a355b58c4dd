"""Fitting a trace's byte addresses onto a target: remapping (fail, wrap, scale) and alignment.

`plan_mapping` checks the sizes once; `apply` maps one chunk of columns with whole-array
numpy, so it can run over a stream of chunks and never loops per I/O in Python.
"""
from dataclasses import dataclass

import numpy as np

from traces.errors import TargetError
from traces.schema import Op
from traces.units import human_bytes

MODES = ("fail", "wrap", "scale")


def _both(n: int) -> str:
    return f"{human_bytes(n)} ({n} bytes)"


@dataclass(frozen=True)
class Mapping:
    """How trace addresses land on a target; build it with `plan_mapping`.

    `usable` is the target size rounded down to `block_size`: every mapped, aligned I/O
    lies inside [0, usable). `mode` is what actually happens: "identity" when the trace
    fits, else the requested "wrap" or "scale".
    """

    mode: str
    span: int
    target_size: int
    block_size: int
    usable: int


def plan_mapping(
    span: int,
    max_length: int,
    target_size: int,
    block_size: int,
    mode: str = "fail",
    *,
    target_path: str = "the target",
) -> Mapping:
    """Decide how a trace whose I/Os end at or before `span` bytes fits a target.

    `max_length` is the longest I/O in the trace. Raises `TargetError` when the trace
    does not fit and `mode` is "fail", or when one I/O is longer than the target.
    """
    if mode not in MODES:
        raise TargetError(f"unknown remap mode {mode!r}; use one of {', '.join(MODES)}")
    if block_size <= 0:
        raise TargetError(f"the block size must be positive, not {block_size}")
    if span < 0 or max_length < 0:
        raise TargetError(
            f"the trace span and I/O length must not be negative ({span}, {max_length})"
        )
    usable = target_size // block_size * block_size
    if usable <= 0:
        raise TargetError(
            f"{target_path} holds {_both(target_size)}, less than one {block_size}-byte block; "
            "use a larger target"
        )
    longest = -(-max_length // block_size) * block_size
    if longest > usable:
        raise TargetError(
            f"the trace has an I/O of {_both(max_length)} but {target_path} holds only "
            f"{_both(usable)} in whole {block_size}-byte blocks; no remapping can fit it, "
            "so use a larger target"
        )
    if span <= target_size:
        return Mapping("identity", span, target_size, block_size, usable)
    if mode == "fail":
        raise TargetError(
            f"the trace spans {_both(span)} but {target_path} holds {_both(target_size)}; "
            "use a larger target or --remap wrap|scale"
        )
    return Mapping(mode, span, target_size, block_size, usable)


def _aligned(offset: np.ndarray, length: np.ndarray, bs: int) -> bool:
    """Whether every offset and length is a multiple of `bs`. Block sizes are powers of two,
    so a mask does it: numpy's int64 modulo took 15 ns a row, the mask 1."""
    rest = np.bitwise_or(offset, length)
    if bs & (bs - 1) == 0:
        np.bitwise_and(rest, bs - 1, out=rest)
    else:
        np.remainder(rest, bs, out=rest)
    return not rest.any()


def apply(
    mapping: Mapping, offset: np.ndarray, length: np.ndarray, op: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int]:
    """Map and align one chunk: new int64 (offset, length), and how many I/Os alignment changed.

    Offsets are rounded down and ends rounded up to the block size, so each I/O still
    covers its original bytes (O_DIRECT needs both aligned). An I/O that would then end
    past the usable size is moved down, keeping its length. Flushes pass through as given.
    The inputs are not modified.
    """
    offset = np.asarray(offset, dtype=np.int64)
    length = np.asarray(length, dtype=np.int64)
    bs, usable = mapping.block_size, mapping.usable
    if mapping.mode == "identity" and _aligned(offset, length, bs):
        # The usual case, in three passes instead of about ten: a trace that fits is aligned
        # already, and its ends, within span <= target_size and whole blocks, lie in usable.
        return offset, length, 0
    flush = np.asarray(op) == Op.FLUSH

    if mapping.mode == "wrap":
        mapped = offset % usable
    elif mapping.mode == "scale":
        # Scale the block number and keep the offset within the block, so an aligned trace
        # stays aligned and no I/O grows. The exact blocks * usable // span overflows int64
        # for large devices (2**31 blocks on each side); float64 multiplication by a
        # constant is monotone, so address order survives, and its error stays under one
        # block until 2**52 blocks. The clamp below catches a result that reaches the end.
        ratio = (usable // bs) / -(-mapping.span // bs)
        mapped = np.floor((offset // bs) * ratio).astype(np.int64) * bs + offset % bs
    else:
        mapped = offset

    start = mapped // bs * bs
    end = -(-(mapped + length) // bs) * bs
    # plan_mapping guarantees each length rounded up fits; only a straddling I/O almost as
    # long as the target can grow past `usable`, and then it is trimmed to the target.
    new_length = np.minimum(end - start, usable)
    changed = ~flush & ((start != mapped) | (new_length != length))
    new_offset = np.minimum(start, usable - new_length)

    new_offset = np.where(flush, offset, new_offset)
    new_length = np.where(flush, length, new_length)
    return new_offset, new_length, int(np.count_nonzero(changed))
