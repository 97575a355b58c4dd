"""tracereplay's one native extension, `native._engine`, built from the Rust crate in engine/
(engine/src/python.rs): the replay engine (Replayer, Progress and the ENGINES and TIMINGS it
runs) and the fast reader of plain delimited text (read_lines). It is the bottom floor, below
traces and replay, so that both may use it; it imports neither.
"""
try:
    from native._engine import ENGINES, TIMINGS, Progress, Replayer, read_lines
except ModuleNotFoundError as e:
    if e.name != "native._engine":
        raise
    raise ImportError("tracereplay's native extension is not built: run `pip install -e .` in the "
                      "checkout, or `cargo build --release` in engine/ and copy "
                      "target/release/lib_engine.so to native/_engine.abi3.so") from None

__all__ = ["ENGINES", "TIMINGS", "Progress", "Replayer", "read_lines"]
