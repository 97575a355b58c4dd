"""tracereplay's plain CSV: a header naming schema columns, then one I/O per line.

Columns are those of traces.schema (required ts_ns, op, offset, length; any optional
ones); op is the numeric Op code. Export then import gives back the same trace.
"""
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from traces import schema
from traces.errors import TraceFormatError
from traces.formats import ordering, reading

NAME = "csv"
DESCRIPTION = "tracereplay CSV (header of schema column names: ts_ns,op,offset,length,...)"
_TYPES = {**{n: pa.from_numpy_dtype(d) for n, d in schema.TRACE_COLUMNS.items()},
          **schema.OPTIONAL_COLUMNS}


def _header(line: str):
    names = [n.strip('"') for n in line.strip().split(",")]
    return names if set(schema.TRACE_COLUMNS) <= set(names) else None


def sniff(path, head) -> bool:
    lines = reading.first_lines(head, 1)
    return bool(lines) and _header(lines[0]) is not None


def read(paths, options):
    heads = []
    for path in paths:
        first = next(reading.iter_lines(path), None)
        names = _header(first[1].decode("utf-8", "replace")) if first else None
        if names is None or first[0] != 1:
            raise TraceFormatError(path, "line 1: the header must name the columns, including "
                                   + ", ".join(schema.TRACE_COLUMNS))
        unknown = [n for n in names if n not in _TYPES]
        if unknown or len(set(names)) != len(names):
            raise TraceFormatError(path, f"line 1: unknown or repeated column {unknown or names}; "
                                   "columns are " + ", ".join(_TYPES))
        heads.append(names)
    if any(h != heads[0] for h in heads):
        raise TraceFormatError(paths[-1], "line 1: the files name different columns")
    metadata = {"description": "Imported from tracereplay CSV: " + ", ".join(p.name for p in paths) + ".",
                "source": {"kind": "import:csv"}, "columns": heads[0]}
    meter = options.get("meter")
    streams = [ordering.ordered_chunks(p, _chunks(p, heads[0], meter), 0, 1, options.get("outliers"))
               for p in paths]
    return metadata, ordering.merge_sorted(streams)


def _chunks(path, names, meter):
    kinds = tuple("str" if n == "comm" else "int" for n in names)
    types = {n: (pa.int64() if n != "comm" else pa.string()) for n in names}
    blocks = reading.read_blocks(path, names, types, check_line=reading.field_checker(kinds),
                                 skip_rows=1, meter=meter, quoted="comm" in names)
    for row0, batch in blocks:
        chunk = {}
        for name in names:
            values = reading.numpy_of(batch.column(name))
            if name != "comm":
                info = np.iinfo(_TYPES[name].to_pandas_dtype())
                if (bad := (values < info.min) | (values > info.max)).any():
                    raise reading.fail_at(path, row0 + int(bad.argmax()),
                                          f"{name} {values[bad.argmax()]} out of range", 1)
            chunk[name] = values
        if (bad := chunk["op"] > 3).any():
            raise reading.fail_at(path, row0 + int(bad.argmax()),
                                  f"op {chunk['op'][bad.argmax()]}; expected 0 read, 1 write, 2 discard, 3 flush", 1)
        reading.check_rows(path, chunk, row0, 1)
        yield row0, chunk


def write(trace, out, options):
    """Every column of `trace`, header first; comm values are quoted where needed."""
    names = [n for n in trace.column_names if n in _TYPES]
    fields = [pa.field(n, pa.string() if n == "comm" else _TYPES[n]) for n in names]
    arrow_schema = pa.schema(fields)
    with pacsv.CSVWriter(str(out), arrow_schema,
                         write_options=pacsv.WriteOptions(quoting_style="needed")) as writer:
        for chunk in trace.chunks(names):
            writer.write_batch(pa.record_batch([pa.array(chunk[n], f.type) for n, f in zip(names, fields)],
                                               schema=arrow_schema))
