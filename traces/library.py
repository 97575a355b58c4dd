"""The bundled trace library: the `.parquet` files in the `traces/` package directory.

A bare name ("demo") means `traces/demo.parquet`; anything else is taken as a path.
"""
import os
from pathlib import Path

from traces.errors import ReplayError

SUFFIX = ".parquet"


def library_dir() -> Path:
    return Path(__file__).resolve().parent


def available() -> list[str]:
    """Names of the bundled traces, sorted."""
    return sorted(p.stem for p in library_dir().glob(f"*{SUFFIX}") if p.is_file())


def resolve(name_or_path) -> Path:
    """The file a trace argument means: an existing path as is, else a library name."""
    path = Path(name_or_path)
    if path.exists():
        return path
    text = os.fspath(name_or_path)
    separators = [s for s in (os.sep, os.altsep) if s]
    if any(s in text for s in separators):
        raise ReplayError(f"{text}: no such trace file; check the path")
    name = text.removesuffix(SUFFIX)
    candidate = library_dir() / f"{name}{SUFFIX}"
    if name and candidate.is_file():
        return candidate
    names = ", ".join(available()) or "none"
    raise ReplayError(
        f"{text}: not a file and not a bundled trace; bundled traces are: {names}"
    )
