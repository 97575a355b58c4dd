"""Turn decoded block events (issue D, complete C, bio queue Q) into trace rows.

One row per issued request: issue time, op and flags from RWBS, offset and length, latency
from the matching completion, and pid/comm of the application that queued the bio.
"""
from dataclasses import dataclass

import numba
import numpy as np

from traces.kernel_types import BOOL, I64, ro_c
from traces.schema import Flag, Op

SECTOR = 512
_OPS = {"R": Op.READ, "W": Op.WRITE, "D": Op.DISCARD, "F": Op.FLUSH}
_MODIFIERS = {"F": Flag.FUA, "S": Flag.SYNC, "M": Flag.META, "A": Flag.READAHEAD}


def cstr(raw: bytes) -> str:
    """A fixed-size kernel char array as text: up to the first NUL (the rest is stale bytes)."""
    return raw.split(b"\0", 1)[0].decode("ascii", "replace")


@dataclass(frozen=True)
class Rwbs:
    op: int | None  # an Op, or None for requests that move no data and are not flushes ("N")
    flags: int
    preflush: bool


def parse_rwbs(text: str) -> Rwbs:
    """RWBS as blk_fill_rwbs writes it: [F preflush] op (R W D DE F N) then F(UA) A S M."""
    preflush = len(text) > 1 and text[0] == "F" and text[1] in "FWDRN"
    body = text[1:] if preflush else text
    op = _OPS.get(body[:1])
    rest = body[1:]
    if body.startswith("DE"):
        rest = body[2:]
    flags = 0
    for ch in rest:
        flags |= _MODIFIERS.get(ch, 0)
    if op is None and preflush:
        op = Op.FLUSH
    return Rwbs(op, int(flags), preflush)


def _per_unique(raw: np.ndarray, fn):
    """Apply `fn` to each distinct value of a bytes array (RWBS, comm: few distinct values)."""
    uniq, inverse = np.unique(raw, return_inverse=True)
    return [fn(cstr(u)) for u in uniq], inverse.reshape(raw.shape)


@numba.njit((ro_c(I64), ro_c(I64), ro_c(BOOL)), nogil=True, cache=True)
def match_fifo(key_a, key_b, is_complete):
    """Pair issues with completions: events sorted by (key_a, key_b, time); within each key
    the k-th completion closes the oldest open issue. Returns (completion index per event
    for issues, or -1; count of completions without an open issue)."""
    n = key_a.size
    match = np.full(n, -1, np.int64)
    queue = np.empty(n, np.int64)
    head = tail = 0
    orphans = 0
    for i in range(n):
        if i == 0 or key_a[i] != key_a[i - 1] or key_b[i] != key_b[i - 1]:
            head = tail = 0
        if is_complete[i]:
            if head < tail:
                match[queue[head]] = i
                head += 1
            else:
                orphans += 1
        else:
            queue[tail] = i
            tail += 1
    return match, orphans


@numba.njit((ro_c(I64), ro_c(BOOL)), nogil=True, cache=True)
def last_before(key, is_target):
    """Events sorted by (key, time, sources first): for each target, the index of the latest
    source event with the same key at or before it, or -1."""
    n = key.size
    out = np.full(n, -1, np.int64)
    last = -1
    for i in range(n):
        if i == 0 or key[i] != key[i - 1]:
            last = -1
        if is_target[i]:
            out[i] = last
        else:
            last = i
    return out


def match_fifo_reference(keys, is_complete):
    """Plain-Python reference of `match_fifo` for tests: keys is a list of hashables in time order."""
    open_, match, orphans = {}, [-1] * len(keys), 0
    for i, (k, c) in enumerate(zip(keys, is_complete)):
        if c:
            if open_.get(k):
                match[open_[k].pop(0)] = i
            else:
                orphans += 1
        else:
            open_.setdefault(k, []).append(i)
    return match, orphans


@dataclass
class Built:
    columns: dict[str, np.ndarray]
    unmatched_issues: int  # issued but not seen completing (still in flight at the end)
    orphan_completions: int  # completed without a seen issue (issued before the start)
    skipped: int  # issues with RWBS "N" (no data, not a flush)


def build(events: dict[str, dict[str, np.ndarray]], start_ns: int) -> Built:
    """Rows in issue order from decoded events (each sorted by `ts`), times relative to start_ns."""
    d, c, q = events["block_rq_issue"], events["block_rq_complete"], events["block_bio_queue"]
    d_rwbs, d_inv = _per_unique(d["rwbs"], parse_rwbs)
    c_rwbs, c_inv = _per_unique(c["rwbs"], parse_rwbs)
    d_op = np.array([-1 if r.op is None else int(r.op) for r in d_rwbs] or [0], np.int64)[d_inv]
    d_flags = np.array([r.flags for r in d_rwbs] or [0], np.int64)[d_inv]
    d_pre = np.array([r.preflush for r in d_rwbs] or [False])[d_inv]
    c_op = np.array([-1 if r.op is None else int(r.op) for r in c_rwbs] or [0], np.int64)[c_inv]
    d_sector = d["sector"].astype(np.int64)  # a flush completes at sector (u64)-1: keep the bits
    c_sector = c["sector"].astype(np.int64)
    d_nr = d["nr_sector"].astype(np.int64)
    c_nr = c["nr_sector"].astype(np.int64)

    # Flushes complete at a different sector than they issue at, so they match among
    # themselves. A flush's completion is followed by a 0-sector completion with no issue
    # (RWBS "WS"): skip 0-sector completions that are not flushes (docs/capture.md).
    d_flush = d_op == Op.FLUSH
    c_flush = c_op == Op.FLUSH
    c_keep = c_flush | (c_nr > 0)
    key_a = np.concatenate([np.where(d_flush, -1, d_sector), np.where(c_flush, -1, c_sector)[c_keep]])
    key_b = np.concatenate([np.where(d_flush, -1, d_nr), np.where(c_flush, -1, c_nr)[c_keep]])
    ts = np.concatenate([d["ts"], c["ts"][c_keep]])
    is_c = np.concatenate([np.zeros(len(d_op), bool), np.ones(int(c_keep.sum()), bool)])
    order = np.lexsort((is_c, ts, key_b, key_a))
    matched, orphans = match_fifo(key_a[order], key_b[order], is_c[order])
    pos = np.empty_like(order)
    pos[order] = np.arange(len(order))
    c_of_d = matched[pos[: len(d_op)]]
    latency = np.where(c_of_d >= 0, ts[order][np.maximum(c_of_d, 0)] - d["ts"], -1)

    # The Q event of the same sector names the application even when a kernel worker issued.
    q_sector = q["sector"].astype(np.int64)
    qk = np.concatenate([q_sector, d_sector])
    qt = np.concatenate([q["ts"], d["ts"]])
    is_d = np.concatenate([np.zeros(len(q_sector), bool), np.ones(len(d_sector), bool)])
    order = np.lexsort((is_d, qt, qk))
    source = last_before(qk[order], is_d[order])
    q_of_d = np.full(len(d_sector), -1, np.int64)
    targets = is_d[order]
    q_of_d[order[targets] - len(q_sector)] = np.where(source[targets] >= 0, order[np.maximum(source[targets], 0)], -1)
    has_q = q_of_d >= 0
    pid = np.where(has_q, q["common_pid"][np.maximum(q_of_d, 0)] if len(q_sector) else 0, d["common_pid"])
    comm_raw = np.where(has_q, q["comm"][np.maximum(q_of_d, 0)] if len(q_sector) else b"", d["comm"])
    comm_names, comm_inv = _per_unique(comm_raw.astype(d["comm"].dtype), lambda s: s)

    # A request carrying a preflush and data becomes a flush row followed by the data row.
    keep = d_op >= 0
    split = keep & d_pre & (d_op != Op.FLUSH)
    rows = np.flatnonzero(keep)
    extra = np.flatnonzero(split)
    src = np.concatenate([extra, rows])
    is_pre = np.concatenate([np.ones(len(extra), bool), np.zeros(len(rows), bool)])
    order = np.lexsort((~is_pre, src))
    src, is_pre = src[order], is_pre[order]
    op = np.where(is_pre, int(Op.FLUSH), d_op[src]).astype(np.uint8)
    length = np.where(is_pre, 0, d_nr[src] * SECTOR)
    offset = np.where(op == Op.FLUSH, 0, d_sector[src] * SECTOR)
    comm = np.array(comm_names, dtype=object)[comm_inv[src]] if len(src) else np.array([], object)
    columns = {
        "ts_ns": (d["ts"][src] - start_ns).astype(np.int64),
        "op": op,
        "offset": offset.astype(np.int64),
        "length": length.astype(np.int64),
        "latency_ns": latency[src].astype(np.int64),
        "pid": pid[src].astype(np.int32),
        "comm": comm,
        "flags": np.where(is_pre, 0, d_flags[src]).astype(np.uint8),
    }
    return Built(columns, int((c_of_d[keep] < 0).sum()), int(orphans), int((~keep).sum()))


def sleeps(events: dict[str, dict[str, np.ndarray]], start_ns: int, pids) -> dict | None:
    """The sleep system calls of the processes in `pids` as {"pid", "start_ns", "end_ns"}
    lists, times relative to start_ns, in time order; None when they were not traced. A sleep
    is an entry followed by the same thread's exit; one cut by the capture's start or end is
    left out."""
    enters = [events[e] for e in ("sys_enter_nanosleep", "sys_enter_clock_nanosleep") if e in events]
    exits = [events[e] for e in ("sys_exit_nanosleep", "sys_exit_clock_nanosleep") if e in events]
    if not enters:
        return None
    ts = np.concatenate([e["ts"] for e in enters + exits]).astype(np.int64)
    pid = np.concatenate([e["common_pid"] for e in enters + exits]).astype(np.int64)
    is_exit = np.concatenate([np.full(len(e["ts"]), k >= len(enters)) for k, e in enumerate(enters + exits)])
    order = np.lexsort((is_exit, ts, pid))
    ts, pid, is_exit = ts[order], pid[order], is_exit[order]
    pair = ~is_exit[:-1] & is_exit[1:] & (pid[:-1] == pid[1:]) & np.isin(pid[:-1], np.asarray(list(pids)))
    enter = np.flatnonzero(pair)
    by_time = np.argsort(ts[enter], kind="stable")
    enter = enter[by_time]
    return {"pid": pid[enter].tolist(), "start_ns": (ts[enter] - start_ns).tolist(),
            "end_ns": (ts[enter + 1] - start_ns).tolist()}
