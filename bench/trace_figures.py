"""What the bundled traces do, computed from the traces themselves: I/Os, duration, bytes read
and written, the distinct bytes written (what a scratch file holds on disk after a replay) and
the span (the size of the scratch file `replay run TRACE` makes). The README's figures for
`make demo` come from here.

    python bench/trace_figures.py [--quick] [--json PATH] [TRACE...]   (default: every bundled trace)
"""
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from _harness import parser, table, write_json  # noqa: E402
from traces.library import resolve  # noqa: E402
from traces.schema import Op  # noqa: E402
from traces.trace import open_trace  # noqa: E402

BLOCK = 4096  # distinct bytes are counted in 4 KiB blocks, the file system's allocation unit


def figures(path) -> dict:
    """One streaming pass for the totals, a second for the distinct blocks written."""
    t = open_trace(path)
    rows = read = written = span = 0
    first = last = None
    for c in t.chunks(["ts_ns", "op", "offset", "length"]):
        rows += len(c["op"])
        read += int(c["length"][c["op"] == Op.READ].sum())
        written += int(c["length"][c["op"] == Op.WRITE].sum())
        span = max(span, int((c["offset"] + c["length"]).max()))
        first = int(c["ts_ns"][0]) if first is None else first
        last = int(c["ts_ns"][-1])
    # +1 where a write's blocks start, -1 after they end: blocks with a positive running sum
    # were written at least once.
    edges = np.zeros(span // BLOCK + 2, dtype=np.int64)
    for c in t.chunks(["op", "offset", "length"]):
        w = c["op"] == Op.WRITE
        np.add.at(edges, c["offset"][w] // BLOCK, 1)
        np.add.at(edges, -(-(c["offset"][w] + c["length"][w]) // BLOCK), -1)
    distinct = int((np.cumsum(edges)[:-1] > 0).sum()) * BLOCK
    return {"trace": t.metadata.get("name") or Path(path).stem, "ios": rows,
            "duration_s": (last - first) / 1e9 if rows else 0.0, "read_bytes": read,
            "written_bytes": written, "distinct_written_bytes": distinct, "span_bytes": span}


def main():
    p = parser(__doc__)
    p.add_argument("traces", nargs="*", help="trace names or paths (default: the bundled traces)")
    a = p.parse_args()
    names = a.traces or (["demo", "oltp"] if a.quick else ["demo", "oltp", "blob", "boot", "filecopy"])
    rows = [figures(resolve(n)) for n in names]
    gb = lambda b: b / 1e9  # noqa: E731
    print(table(["trace", "I/Os", "duration s", "read GB", "written GB", "distinct written GB", "span GiB"],
                [[r["trace"], r["ios"], r["duration_s"], gb(r["read_bytes"]), gb(r["written_bytes"]),
                  gb(r["distinct_written_bytes"]), r["span_bytes"] / 2**30] for r in rows]))
    write_json(a.json, {"traces": rows})


if __name__ == "__main__":
    main()
