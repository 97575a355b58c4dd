"""tracereplay's one native extension, `native._engine`, built from the Rust crate in engine/
(engine/src/python.rs): the replay engine (Replayer, Progress and the ENGINES and TIMINGS it
runs) and the fast reader of plain delimited text (read_lines). It is the bottom floor, below
traces and replay, so that both may use it; it imports neither.
"""
from native._engine import ENGINES, TIMINGS, Progress, Replayer, read_lines

__all__ = ["ENGINES", "TIMINGS", "Progress", "Replayer", "read_lines"]
