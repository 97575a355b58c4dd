"""A Numba kernel that reads the plain lines of a delimited text format (NetApp controller
CSV) faster than pyarrow's read_csv, which tokenises and checks every field of every line:
it converts only the columns kept and skips over the rest, eight bytes at a time. It reads
the simple case alone and gives up on anything else, which pyarrow then reads as before,
errors included (traces.formats.reading.read_blocks).
"""
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import intrinsic

from traces.kernel_types import F64, I64, U8, ro_c, rw

SKIP, INTEGER, DECIMAL = 0, 1, 2
# The kernel's decimals are exact integers of thousandths before they become floats: only
# below 2^53 is that float the one a correctly rounding parser (pyarrow's) gives.
_MAX_THOUSANDTHS = 1 << 53
_COMMA, _LF, _CR, _DOT, _MINUS = 44, 10, 13, 46, 45
# Eight bytes at once (SWAR): a byte pattern repeated in each byte of a uint64.
_ONES, _HIGH = np.uint64(0x0101010101010101), np.uint64(0x8080808080808080)
_COMMAS, _LFS, _CRS = np.uint64(0x2C2C2C2C2C2C2C2C), np.uint64(0x0A0A0A0A0A0A0A0A), np.uint64(0x0D0D0D0D0D0D0D0D)
_ZEROS, _NIBBLE, _SIXES = np.uint64(0x3030303030303030), np.uint64(0xF0F0F0F0F0F0F0F0), np.uint64(0x0606060606060606)
_LOW7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_POW10 = np.array([10**i for i in range(9)], np.uint64)


@intrinsic
def _load64(typingctx, buf, pos):
    """The 8 bytes of a uint8 array at `pos` as one little-endian uint64 (an unaligned load)."""

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        ptr = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(64).as_pointer())
        return builder.load(ptr, align=1)

    return types.uint64(buf, pos), codegen


# The helpers take words, never arrays: an array passed to a helper costs a reference count
# taken and dropped on every call: 215 instead of 72 ns a NetApp line.

@numba.njit(nogil=True, inline="always")
def _zero_bytes(x):
    """The high bit of each zero byte of x set (exact up to the first zero byte)."""
    return (x - _ONES) & ~x & _HIGH


@numba.njit(nogil=True, inline="always")
def _each_zero_byte(x):
    """The high bit of each zero byte of x set, all of them exact."""
    return ~(((x & _LOW7) + _LOW7) | x | _LOW7)


@numba.njit(nogil=True, inline="always")
def _stops(w):
    """The bytes of w that end a field (comma, LF, CR) marked; exact up to the first."""
    return _zero_bytes(w ^ _COMMAS) | _zero_bytes(w ^ _LFS) | _zero_bytes(w ^ _CRS)


@numba.njit(nogil=True, inline="always")
def _non_digits(w):
    """The bytes of w that are not ASCII digits marked; exact up to the first."""
    return ((w & _NIBBLE) ^ _ZEROS) | (((w + _SIXES) & _NIBBLE) ^ _ZEROS)


@numba.njit(nogil=True, inline="always")
def _first(marks):
    """The index of the first marked byte."""
    return np.int64(trailing_zeros(marks)) >> 3


@numba.njit(nogil=True, inline="always")
def _eight(t):
    """The number in 8 digit values (0-9, the first in the lowest byte), in 3 multiplications."""
    t = t * np.uint64(10) + (t >> np.uint64(8))
    mask = np.uint64(0x000000FF000000FF)
    return ((t & mask) * np.uint64(0x000F424000000064)
            + ((t >> np.uint64(16)) & mask) * np.uint64(0x0000271000000001)) >> np.uint64(32)


@numba.njit((ro_c(U8), ro_c(I64), ro_c(I64), rw(I64, 2), rw(F64, 2)), nogil=True, cache=True)
def parse_lines(buf, kinds, slots, ints, floats):
    """Read the lines of `buf` (comma-separated, each with kinds.size fields) into columns:
    (rows read, LFs read).

    kinds[f] is SKIP, INTEGER (an optional minus and 1-18 digits, into ints[slots[f]]) or
    DECIMAL (1-15 digits, then optionally a point and 1-3 digits, into floats[slots[f]] as
    the float64 nearest the decimal). Empty lines are passed over, a line may end in CR LF,
    the last one needs no LF. The output arrays have room for `capacity` rows.

    Rows are -1 when a line is anything else: a field count, character or value this kernel
    does not read (a quote, a space, an exponent, a lone CR, "nan"...), for pyarrow to read
    instead, or when there are more rows than room.
    """
    n = buf.size
    fields = kinds.size
    # runs[f]: how many fields from f on are skipped and each followed by a comma. A run is
    # passed over by counting its commas eight bytes at a time (75 -> 68 ns a NetApp line,
    # whose 10 skipped fields lie in runs of 1, 5, 1 and 3), not field by field.
    runs = np.zeros(fields, np.int64)
    for f in range(fields - 2, -1, -1):
        runs[f] = runs[f + 1] + 1 if kinds[f] == SKIP else 0
    capacity = max(ints.shape[1] if ints.shape[0] else 0, floats.shape[1] if floats.shape[0] else 0)
    pos = 0
    row = 0
    newlines = 0
    while pos < n:
        c = buf[pos]
        if c == _LF:
            pos += 1
            newlines += 1
            continue
        if c == _CR and pos + 1 < n and buf[pos + 1] == _LF:
            pos += 2
            newlines += 1
            continue
        if row == capacity:
            return -1, newlines
        f = 0
        while f < fields:
            kind = kinds[f]
            if runs[f]:
                left = runs[f]
                while True:
                    if pos + 8 <= n:
                        w = _load64(buf, pos)
                        commas = _each_zero_byte(w ^ _COMMAS)
                        ends = _each_zero_byte(w ^ _LFS) | _each_zero_byte(w ^ _CRS)
                        while commas and left > 1:
                            commas &= commas - np.uint64(1)
                            left -= 1
                        if commas:  # the run's last comma: no line may end before it
                            if ends & ((commas & (np.uint64(0) - commas)) - np.uint64(1)):
                                return -1, newlines
                            pos += _first(commas) + 1
                            break
                        if ends:
                            return -1, newlines
                        pos += 8
                    else:
                        if pos >= n or buf[pos] == _LF or buf[pos] == _CR:
                            return -1, newlines
                        pos += 1
                        if buf[pos - 1] == _COMMA:
                            left -= 1
                            if left == 0:
                                break
                f += runs[f]
                continue
            if kind == SKIP:
                while pos + 8 <= n:
                    marks = _stops(_load64(buf, pos))
                    if marks:
                        pos += _first(marks)
                        break
                    pos += 8
                else:
                    while pos < n and buf[pos] != _COMMA and buf[pos] != _LF and buf[pos] != _CR:
                        pos += 1
            else:
                negative = kind == INTEGER and pos < n and buf[pos] == _MINUS
                if negative:
                    pos += 1
                # The digits: eight at a time while eight bytes remain, then one at a time.
                value = np.uint64(0)
                start = pos
                while pos + 8 <= n:
                    w = _load64(buf, pos)
                    marks = _non_digits(w)
                    if marks == 0:
                        value = value * np.uint64(100000000) + _eight(w - _ZEROS)
                        pos += 8
                        continue
                    k = _first(marks)
                    if k:  # the k digits moved to the top bytes: zeros lead them
                        value = value * _POW10[k] + _eight((w - _ZEROS) << np.uint64(8 * (8 - k)))
                        pos += k
                    break
                else:
                    while pos < n and np.uint64(buf[pos]) - np.uint64(48) <= np.uint64(9):
                        value = value * np.uint64(10) + (np.uint64(buf[pos]) - np.uint64(48))
                        pos += 1
                count = pos - start  # past 18 digits the value wrapped: given up below
                if kind == INTEGER:
                    if count == 0 or count > 18:
                        return -1, newlines
                    ints[slots[f], row] = -np.int64(value) if negative else np.int64(value)
                else:
                    if count == 0 or count > 15:
                        return -1, newlines
                    thousandths = np.int64(value) * 1000
                    if pos < n and buf[pos] == _DOT:
                        pos += 1
                        start = pos
                        fraction = np.uint64(0)
                        if pos + 8 <= n:  # the 1-3 digits from one word, as the integer's
                            w = _load64(buf, pos)
                            marks = _non_digits(w)
                            count = _first(marks) if marks else 8
                            if count:
                                fraction = _eight((w - _ZEROS) << np.uint64(8 * (8 - count)))
                            pos += count
                        else:
                            while pos < n and pos - start < 4 and np.uint64(buf[pos]) - np.uint64(48) <= np.uint64(9):
                                fraction = fraction * np.uint64(10) + (np.uint64(buf[pos]) - np.uint64(48))
                                pos += 1
                            count = pos - start
                        if count == 0 or count > 3:
                            return -1, newlines
                        thousandths += np.int64(fraction) * (100 if count == 1 else 10 if count == 2 else 1)
                    if thousandths >= _MAX_THOUSANDTHS:
                        return -1, newlines
                    floats[slots[f], row] = np.float64(thousandths) / 1000.0
            # The separator after the field: a comma, or the end of the line after the last.
            if f < fields - 1:
                if pos >= n or buf[pos] != _COMMA:
                    return -1, newlines
                pos += 1
            else:
                if pos < n and buf[pos] == _CR:
                    pos += 1
                    if pos >= n or buf[pos] != _LF:
                        return -1, newlines
                if pos < n:
                    if buf[pos] != _LF:
                        return -1, newlines
                    pos += 1
                    newlines += 1
            f += 1
        row += 1
    return row, newlines
