"""The Numba kernels of the blktrace import (traces.formats.blktrace): decoding records,
ordering per-CPU streams, pairing events into I/Os and making rows. Apart from the format's
module so that sniffing a file, which imports every format, loads no Numba: the kernels load
with the first read (0.15 s for Numba and about 0.2 s for these kernels from the cache).
"""
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from traces.formats.blktrace import ACT_COMPLETE, ACT_QUEUE, TC_NOTIFY
from traces.kernel_types import BOOL, I64, U8, U32, U64, ro_c, rw

# ---------------------------------------------------------------- decoding records


def _load_intrinsic(bits: int, big: bool):
    """A Numba intrinsic: the `bits`-bit unsigned integer at byte `pos` of a uint8 array, as
    uint64, in the given byte order: one unaligned load (and a byte swap for big-endian).
    Assembling the bytes one at a time in a loop made decoding 5x slower (45 ns a record)."""

    @intrinsic
    def load(typingctx, buf, pos):
        def codegen(context, builder, signature, args):
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            ptr = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(bits).as_pointer())
            value = builder.load(ptr, align=1)
            if big:
                value = builder.bswap(value)
            return builder.zext(value, ir.IntType(64)) if bits < 64 else value

        return types.uint64(buf, pos), codegen

    return load


_LE16, _LE32, _LE64 = (_load_intrinsic(bits, False) for bits in (16, 32, 64))
_BE16, _BE32, _BE64 = (_load_intrinsic(bits, True) for bits in (16, 32, 64))


# Each kernel called from Python has one explicit signature (traces.kernel_types), its inputs
# read-only and C-contiguous (`ro_c`: any layout made the kernels 1.3x slower, and the loads
# above index bytes from the data pointer, so a strided buffer would read wrong). The
# helpers called only from kernels have neither signature nor cache: they compile into their
# callers, whose cached code holds them.

@numba.njit(nogil=True, inline="always")
def _u16(buf, pos, big):
    return _BE16(buf, pos) if big else _LE16(buf, pos)


@numba.njit(nogil=True, inline="always")
def _u32(buf, pos, big):
    return _BE32(buf, pos) if big else _LE32(buf, pos)


@numba.njit(nogil=True, inline="always")
def _u64(buf, pos, big):
    return _BE64(buf, pos) if big else _LE64(buf, pos)


@numba.njit((ro_c(U8), BOOL, rw(I64), rw(U64), rw(U32), rw(U32), rw(U32), rw(U32), rw(I64)),
            nogil=True, cache=True)
def decode(buf, big, time, sector, nbytes, action, pid, device, notify):
    """Decode the whole records at the start of `buf` into the six column arrays (each with
    room for buf.size // 48 + 1 records), in one pass: pdu_len varies, so this is a loop.

    Returns (records, end of the last whole record, offset of a record whose magic or
    version is wrong or -1, count of notify records, whose offsets go to `notify`).
    """
    n = buf.size
    count = 0
    notes = 0
    pos = 0
    while pos + 48 <= n:
        if _u32(buf, pos, big) != 0x65617407:
            return count, pos, pos, notes
        pdu = np.int64(_u16(buf, pos + 46, big))
        if pos + 48 + pdu > n:
            break
        time[count] = np.int64(_u64(buf, pos + 8, big))
        sector[count] = _u64(buf, pos + 16, big)
        nbytes[count] = np.uint32(_u32(buf, pos + 24, big))
        act = np.uint32(_u32(buf, pos + 28, big))
        action[count] = act
        pid[count] = np.uint32(_u32(buf, pos + 32, big))
        device[count] = np.uint32(_u32(buf, pos + 36, big))
        if (act >> np.uint32(16)) & np.uint32(TC_NOTIFY):
            notify[notes] = pos
            notes += 1
        count += 1
        pos += 48 + pdu
    return count, pos, -1, notes



@numba.njit(nogil=True, inline="always")
def _stage(action):
    code = action & 0xFF
    return 0 if code == ACT_QUEUE else (2 if code == ACT_COMPLETE else 1)


@numba.njit((ro_c(I64), ro_c(U32)), nogil=True, cache=True)
def ordered(time, action):
    """Whether the events are in (time, stage) order."""
    for i in range(1, time.size):
        if time[i] < time[i - 1] or (time[i] == time[i - 1] and _stage(action[i]) < _stage(action[i - 1])):
            return False
    return True


@numba.njit((ro_c(I64), ro_c(U64), ro_c(U32), ro_c(U32), ro_c(U32), ro_c(U32),
             ro_c(I64), ro_c(U64), ro_c(U32), ro_c(U32), ro_c(U32), ro_c(U32)),
            nogil=True, cache=True)
def merge_two(time, sector, nbytes, action, pid, device,
               time2, sector2, nbytes2, action2, pid2, device2):
    """Merge two runs in (time, stage) order, ties to the first, into new columns. (A k-way
    kernel over one concatenation of the runs took twice as long.)"""
    na, nb = time.size, time2.size
    n = na + nb
    out = (np.empty(n, time.dtype), np.empty(n, sector.dtype), np.empty(n, nbytes.dtype),
           np.empty(n, action.dtype), np.empty(n, pid.dtype), np.empty(n, device.dtype))
    i = j = 0
    for k in range(n):
        first = j >= nb or (i < na and (time[i] < time2[j] or (
            time[i] == time2[j] and _stage(action[i]) <= _stage(action2[j]))))
        if first:
            out[0][k], out[1][k], out[2][k] = time[i], sector[i], nbytes[i]
            out[3][k], out[4][k], out[5][k] = action[i], pid[i], device[i]
            i += 1
        else:
            out[0][k], out[1][k], out[2][k] = time2[j], sector2[j], nbytes2[j]
            out[3][k], out[4][k], out[5][k] = action2[j], pid2[j], device2[j]
            j += 1
    return out


# ---------------------------------------------------------------- events to I/Os

# kinds for match
_K_OTHER, _K_IO, _K_COMPLETE, _K_QUEUE, _K_BACK_MERGE, _K_FRONT_MERGE = 0, 1, 2, 3, 4, 5


@numba.njit(nogil=True)
def _hash(device, sector, nbytes):
    h = np.uint64(sector) * np.uint64(0x9E3779B97F4A7C15)
    h ^= np.uint64(nbytes) * np.uint64(0xC2B2AE3D27D4EB4F)
    h ^= np.uint64(device) * np.uint64(0x165667B19E3779F9)
    h ^= h >> np.uint64(29)
    return h



@numba.njit(nogil=True)
def _key_home(e, device, sector, nbytes, mask):
    return np.int64(_hash(device[e], sector[e], nbytes[e]) & np.uint64(mask))


@numba.njit(nogil=True)
def _insert(slots, e, device, sector, nbytes):
    mask = slots.size - 1
    s = _key_home(e, device, sector, nbytes, mask)
    while slots[s] != -1:
        s = (s + 1) & mask
    slots[s] = e


@numba.njit(nogil=True)
def _delete(slots, s, device, sector, nbytes):
    """Empty slot `s` by backward-shift deletion: later entries of the cluster move into the
    hole unless their home lies cyclically in (hole, position], so equal keys keep their
    insertion order."""
    mask = slots.size - 1
    hole = s
    t = s
    while True:
        t = (t + 1) & mask
        e = slots[t]
        if e == -1:
            break
        home = _key_home(e, device, sector, nbytes, mask)
        if hole <= t:
            stays = hole < home <= t
        else:
            stays = home > hole or home <= t
        if not stays:
            slots[hole] = e
            hole = t
    slots[hole] = -1


@numba.njit(nogil=True)
def _remove(slots, e, device, sector, nbytes):
    """Take waiting event `e` out of the table."""
    mask = slots.size - 1
    s = _key_home(e, device, sector, nbytes, mask)
    while slots[s] != e:
        s = (s + 1) & mask
    _delete(slots, s, device, sector, nbytes)


@numba.njit((ro_c(U8), ro_c(U32), ro_c(U64), ro_c(U32), I64), nogil=True, cache=True)
def match(kind, device, sector, nbytes, queue_slots):
    """Pair each I/O event with the first later completion of the same (device, sector,
    bytes), first in first out; and each I/O event with the last queue event at the same
    (device, sector) before it, if a later queue event has not taken its slot.

    Queue events merged into a waiting request (a back merge M or front merge F after their
    Q) make that request's first Q grow to the size its D and C will carry, and complete
    with it: the completion is the partner of every Q merged in.

    One pass. Waiting I/Os live in a linear-probing table with backward-shift deletion, so it
    holds only the I/Os in flight (it doubles when half full) and stays in cache; deletion
    keeps equal keys in insertion order, which is what makes the pairing FIFO. An earlier
    version sized the table by the window's events: 32 MB tables, ~100 ns a record in cache
    misses.
    """
    n = kind.size
    partner = np.full(n, -1, np.int64)
    queued_by = np.full(n, -1, np.int64)
    slots = np.full(1 << 12, -1, np.int64)
    used = 0
    recent_q = np.full(queue_slots, -1, np.int64)
    qmask = queue_slots - 1
    # Requests as merges grow them (start sector, bytes), the Qs merged into each (a list
    # through `merged`), and the waiting requests by where they end and where they start.
    start = sector.copy()
    size = nbytes.copy()
    merged = np.full(n, -1, np.int64)
    last_io = np.full(queue_slots, -1, np.int64)
    by_end = np.full(queue_slots, -1, np.int64)
    by_start = np.full(queue_slots, -1, np.int64)
    for i in range(n):
        k = kind[i]
        if k == 0:
            continue
        if k == 3 or k == 1:
            q = np.int64(_hash(device[i], sector[i], 0) & np.uint64(qmask))
            if k == 3:
                recent_q[q] = i
                continue
            j = recent_q[q]
            if j >= 0 and device[j] == device[i] and sector[j] == sector[i]:
                queued_by[i] = j
        if k == 1:
            if 2 * (used + 1) > slots.size:
                waiting = np.sort(slots[slots >= 0])  # oldest first keeps FIFO order
                slots = np.full(slots.size * 2, -1, np.int64)
                for e in waiting:
                    _insert(slots, e, device, start, size)
            _insert(slots, i, device, start, size)
            used += 1
            last_io[_key_home(i, device, start, size, qmask)] = i
            by_end[np.int64(_hash(device[i], start[i] + size[i] // 512, 1) & np.uint64(qmask))] = i
            by_start[np.int64(_hash(device[i], start[i], 2) & np.uint64(qmask))] = i
            continue
        if k == 4 or k == 5:
            # The merged bio's own Q, still waiting, and the request it joins.
            b = last_io[_key_home(i, device, sector, nbytes, qmask)]
            if b < 0 or partner[b] >= 0 or device[b] != device[i] or start[b] != sector[i] \
                    or size[b] != nbytes[i]:
                continue
            if k == 4:
                r = by_end[np.int64(_hash(device[i], sector[i], 1) & np.uint64(qmask))]
                fits = r >= 0 and start[r] + size[r] // 512 == sector[i]
            else:
                r = by_start[np.int64(_hash(device[i], sector[i] + nbytes[i] // 512, 2) & np.uint64(qmask))]
                fits = r >= 0 and start[r] == sector[i] + nbytes[i] // 512
            if not fits or r == b or partner[r] >= 0 or device[r] != device[i]:
                continue
            _remove(slots, b, device, start, size)
            _remove(slots, r, device, start, size)
            used -= 1
            if k == 5:
                start[r] = sector[i]
            size[r] += nbytes[i]
            _insert(slots, r, device, start, size)
            by_end[np.int64(_hash(device[r], start[r] + size[r] // 512, 1) & np.uint64(qmask))] = r
            by_start[np.int64(_hash(device[r], start[r], 2) & np.uint64(qmask))] = r
            last_io[_key_home(b, device, start, size, qmask)] = -1
            # b's own merged Qs, if any, come along.
            tail = b
            while merged[tail] >= 0:
                tail = merged[tail]
            merged[tail] = merged[r]
            merged[r] = b
            continue
        mask = slots.size - 1
        s = _key_home(i, device, sector, nbytes, mask)
        while slots[s] != -1:
            j = slots[s]
            if device[j] == device[i] and start[j] == sector[i] and size[j] == nbytes[i]:
                partner[i] = j
                while j >= 0:
                    partner[j] = i
                    j = merged[j]
                used -= 1
                _delete(slots, s, device, start, size)
                break
            s = (s + 1) & mask
    return partner, queued_by


@numba.njit((ro_c(U32), ro_c(U32), I64, BOOL), nogil=True, cache=True)
def classify(action, nbytes, io_code, want_queue):
    """The match kind of each record, in one pass (numpy masks took ~8 passes)."""
    kind = np.zeros(action.size, np.uint8)
    for i in range(action.size):
        code = action[i] & 0xFF
        category = action[i] >> 16
        if category & 0x400:  # TC_NOTIFY
            continue
        # A 0-byte completion without FLUSH ends a flush sequence; it has no issue of its own.
        has_data = nbytes[i] != 0 or (category & 0x4) != 0
        if code == io_code:
            if has_data:
                kind[i] = 1
        elif code == 8:
            if has_data:
                kind[i] = 2
        elif code == 1 and want_queue:
            kind[i] = 3
        elif (code == 2 or code == 3) and io_code == 1 and nbytes[i] != 0:
            kind[i] = 4 if code == 2 else 5  # back or front merge of a queued bio
    return kind


@numba.njit(nogil=True, inline="always")
def _op_flags_one(action, nbytes):
    """(op, Flag bits) of one record from its category bits."""
    category = action >> 16
    if category & 0x2000:  # DISCARD
        op = 2
    elif (category & 0x4) and nbytes == 0:  # FLUSH, empty
        op = 3
    elif category & 0x2:  # WRITE
        op = 1
    else:
        op = 0
    f = 0
    if category & 0x8:  # SYNC
        f |= 1
    if category & 0x8000:  # FUA
        f |= 2
    if category & 0x1000:  # META
        f |= 4
    if category & 0x800:  # AHEAD
        f |= 8
    return np.uint8(op), np.uint8(f)


@numba.njit((ro_c(U32), ro_c(U32)), nogil=True, cache=True)
def op_and_flags(action, nbytes):
    """Op and Flag bits of each record from its category bits, in one pass."""
    n = action.size
    op = np.empty(n, np.uint8)
    flags = np.empty(n, np.uint8)
    for i in range(n):
        op[i], flags[i] = _op_flags_one(action[i], nbytes[i])
    return op, flags


@numba.njit((ro_c(U8), ro_c(I64), ro_c(I64), ro_c(I64), ro_c(U64), ro_c(U32), ro_c(U32), ro_c(U32),
             ro_c(U32), I64, BOOL, I64, I64), nogil=True, cache=True)
def window_rows(kind, partner, queued_by, time, sector, nbytes, action, pid, device, t0,
                 final, horizon, max_carry):
    """Everything a matched window gives, in three passes (NumPy took some twenty):

    - the cut: unless `final`, the first I/O still waiting for its completion within
      `horizon` of the window's last event (but at most `max_carry` events from the end);
    - the row columns of the I/O events before the cut (ts_ns from t0, offset, length,
      latency or -1, the queuer's pid, device, op, flags, and whether a write carries a
      pre-flush);
    - the events from the cut on that go to the next window (all but the completions of
      rows emitted now), the completions before the cut that matched nothing, and whether
      the window holds any completion.
    """
    n = time.size
    cut = n
    if not final and n:
        for i in range(n):
            if kind[i] == 1 and partner[i] < 0 and time[i] >= time[n - 1] - horizon:
                cut = max(i, n - max_carry)
                break
    rows = 0
    seen_completion = False
    for i in range(n):
        if kind[i] == 1 and i < cut:
            rows += 1
        if action[i] & 0xFF == 8:
            seen_completion = True
    ts = np.empty(rows, np.int64)
    offset = np.empty(rows, np.int64)
    length = np.empty(rows, np.int64)
    latency = np.empty(rows, np.int64)
    out_pid = np.empty(rows, np.int32)
    out_device = np.empty(rows, np.uint32)
    op = np.empty(rows, np.uint8)
    flags = np.empty(rows, np.uint8)
    preflush = np.empty(rows, np.bool_)
    consumed = np.zeros(n, np.bool_)
    k = 0
    for i in range(cut):
        if kind[i] != 1:
            continue
        ts[k] = time[i] - t0
        offset[k] = np.int64(sector[i]) * 512
        length[k] = nbytes[i]
        c = partner[i]
        if c >= 0:
            latency[k] = time[c] - time[i]
            consumed[c] = True
        else:
            latency[k] = -1
        q = queued_by[i]
        out_pid[k] = np.int32(pid[q] if q >= 0 else pid[i])
        out_device[k] = device[i]
        op[k], flags[k] = _op_flags_one(action[i], nbytes[i])
        preflush[k] = op[k] == 1 and (action[i] >> 16) & 0x4 != 0  # WRITE with TC_FLUSH
        k += 1
    unmatched = 0
    for i in range(cut):
        if kind[i] == 2 and not consumed[i]:
            unmatched += 1
    carry = np.empty(n - cut, np.int64)
    m = 0
    for i in range(cut, n):
        if not consumed[i]:
            carry[m] = i
            m += 1
    columns = (ts, offset, length, latency, out_pid, out_device, op, flags)
    return columns, preflush, carry[:m], unmatched, seen_completion
