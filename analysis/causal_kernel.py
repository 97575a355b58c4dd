"""The Numba kernel of causal inference (analysis.causal): one pass over a chunk's rows,
replaying completions from a heap of the I/Os in flight, with the state carried from chunk to
chunk. Apart from analysis.causal so that importing its names and choices loads no Numba.
"""
import numba
import numpy as np
from numba import types
from numba.typed import Dict, List

from analysis.causal import BARRIER, DURABLE_WINDOW_NS, JOURNAL, RECENT, WRITEBACK
from traces.kernel_types import I32, I64, I8, U8, ro_c, rw

_PENDING = types.UniTuple(types.int64, 4)  # (done_ns, row, group, is_write | durable << 1 | op << 2)


def new_state():
    """What `annotate_kernel` carries from one chunk to the next."""
    heap = List.empty_list(_PENDING)
    last_row = Dict.empty(types.int64, types.int64)
    last_done = Dict.empty(types.int64, types.int64)
    last_op = Dict.empty(types.int64, types.int64)
    # [any row, any done, write row, write done, any durable, any op]: the latest completions
    # seen so far, whether the latest was a journal, writeback, flush or FUA I/O, and its op
    latest = np.full(6, -1, dtype=np.int64)
    # the last RECENT completions as (done, row, group, op), a ring; recent_n: how many so far
    recent = np.full((RECENT, 4), -1, dtype=np.int64)
    recent_n = np.zeros(1, dtype=np.int64)
    return heap, last_row, last_done, last_op, latest, recent, recent_n


# The heap's helpers come first: the kernel below compiles as it is defined.
@numba.njit(inline="always")
def _less(a, b):
    return a[0] < b[0] or (a[0] == b[0] and a[1] < b[1])


@numba.njit
def heapq_push(heap, item):
    heap.append(item)
    i = len(heap) - 1
    while i > 0:
        up = (i - 1) >> 1
        if _less(heap[i], heap[up]):
            heap[i], heap[up] = heap[up], heap[i]
            i = up
        else:
            break


@numba.njit
def heapq_pop(heap):
    top = heap[0]
    last = heap.pop()
    n = len(heap)
    if n:
        heap[0] = last
        i = 0
        while True:
            left = 2 * i + 1
            if left >= n:
                break
            child = left
            if left + 1 < n and _less(heap[left + 1], heap[left]):
                child = left + 1
            if _less(heap[child], heap[i]):
                heap[i], heap[child] = heap[child], heap[i]
                i = child
            else:
                break
    return top


@numba.njit(
    (I64, ro_c(I64), ro_c(U8), ro_c(I64), ro_c(I64), ro_c(U8), ro_c(I64), I64, I64, I64,
    types.ListType(types.UniTuple(I64, 4)), types.DictType(I64, I64), types.DictType(I64, I64),
    types.DictType(I64, I64), rw(I64), rw(I64, 2), rw(I64), rw(I32), rw(I32), rw(I64), rw(I8),
    rw(U8)),
    nogil=True, cache=True,
)
def annotate_kernel(base, ts, op, latency, group, flags, woke, kind, window_ns, max_back,
                    heap, last_row, last_done, last_op, latest, recent, recent_n,
                    parent, parent2, think, from_op, woken):
    """One chunk: rows base..base+len. Completions are replayed in time order from a heap of
    the rows in flight, so every parent completed no later than its child was issued.
    parent2 is BARRIER for a flush that waits for every earlier row; from_op is the op of the
    parent the think time runs from (-1: none). woke: when the row's process last woke from a
    sleep since its previous I/O (-1: it did not sleep); woken: 1 where the row waits for the
    I/O that ended such a sleep."""
    for k in range(len(ts)):
        row = base + k
        t = ts[k]
        while len(heap) and heap[0][0] <= t:
            done, r, g, w = heapq_pop(heap)
            last_row[g] = r
            last_done[g] = done
            last_op[g] = w >> 2
            latest[0], latest[1], latest[4], latest[5] = r, done, ((w >> 1) & 1) | np.int64(g < 0), w >> 2
            if w & 1:
                latest[2], latest[3] = r, done
            slot = recent_n[0] % RECENT
            recent[slot, 0], recent[slot, 1], recent[slot, 2], recent[slot, 3] = done, r, g, w >> 2
            recent_n[0] += 1
        p1 = -1
        d1 = -1
        o1 = -1
        if kind == 1:  # recent
            if latest[0] >= 0 and t - latest[1] <= window_ns:
                p1, d1, o1 = latest[0], latest[1], latest[5]
        else:
            g = group[k]
            if g in last_row:
                p1, d1, o1 = last_row[g], last_done[g], last_op[g]
            elif latest[0] >= 0:
                # A process's first I/O: it started after what completed last (a shell's
                # `cp && sync`), not at a time of its own.
                p1, d1, o1 = latest[0], latest[1], latest[5]
        if p1 >= 0 and row - p1 > max_back:
            p1 = -1
        p2 = -1
        d2 = -1
        o2 = -1
        barrier = False
        wake = -1
        if kind != 1 and woke[k] >= 0 and group[k] >= 0:
            # The process slept since its last I/O: polling for what another process held (a
            # lock). It waits for the other process's I/O that completed last before it woke,
            # then its own time after waking; the rest of the sleep was the poll's interval.
            for j in range(min(recent_n[0], RECENT)):
                slot = (recent_n[0] - 1 - j) % RECENT
                if recent[slot, 0] <= woke[k] and recent[slot, 2] != group[k]:
                    if recent[slot, 0] > d1 and row - recent[slot, 1] <= max_back:
                        wake = slot
                    break
        if op[k] == 3 and len(heap) == 0 and latest[0] >= 0 and group[k] not in last_row:
            # A process whose first I/O is a flush, issued with nothing in flight, flushes
            # what others wrote (sync after cp): it waits for every earlier I/O. One that
            # wrote before (fdatasync of its own writes) waits for its chain and last write.
            barrier = True
            d2, o2 = latest[1], latest[5]
        elif (op[k] == 3 or (op[k] == 1 and flags[k] & 2)) and latest[2] >= 0 and latest[2] != p1:
            # Else a flush, and a FUA write, waits for the last write completed before it.
            if row - latest[2] <= max_back:
                p2, d2, o2 = latest[2], latest[3], 1
        elif wake >= 0:
            p2, d2, o2 = recent[wake, 1], recent[wake, 0], recent[wake, 3]
            woken[k] = 1
        elif kind == 2 and latest[0] >= 0 and latest[0] != p1 and latest[1] > d1 \
                and (group[k] == WRITEBACK
                     or t - latest[1] <= (DURABLE_WINDOW_NS if latest[4] or group[k] == JOURNAL else window_ns)) \
                and row - latest[0] <= max_back:
            # hybrid: also the last completion of any process, just before this I/O. The
            # kernel's threads have no time of their own: a journal commit follows the writes
            # it commits (the durable window), and writeback, however long after, what the
            # applications did last (dirtied pages, a sync), not its own previous write.
            p2, d2, o2 = latest[0], latest[1], latest[5]
        if p1 < 0 and p2 >= 0:
            p1, d1, o1, p2, d2, o2 = p2, d2, o2, -1, -1, -1
        parent[k] = row - p1 if p1 >= 0 else 0
        parent2[k] = BARRIER if barrier else (row - p2 if p2 >= 0 else 0)
        think[k] = t - woke[k] if woken[k] else t - max(d1, d2) if (p1 >= 0 or barrier) else 0
        from_op[k] = (o2 if d2 > d1 else o1) if (p1 >= 0 or barrier) else -1
        if latency[k] >= 0:
            durable = op[k] == 3 or (op[k] == 1 and flags[k] & 2)
            heapq_push(heap, (t + latency[k], row, group[k],
                              np.int64(op[k] == 1) | (np.int64(durable) << 1) | (np.int64(op[k]) << 2)))
