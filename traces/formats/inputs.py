"""Opening trace inputs that may be compressed (.gz, .xz, .zst), by content, not by name."""
import gzip
import io
import lzma
from pathlib import Path

from traces.errors import TraceFormatError

HEAD_BYTES = 64 * 1024
_MAGIC = {b"\x1f\x8b": "gzip", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


def compression(path: Path) -> str | None:
    """'gzip', 'xz', 'zstd' or None, from the file's first bytes."""
    try:
        with open(path, "rb") as f:
            start = f.read(6)
    except OSError as e:
        raise TraceFormatError(path, f"cannot read: {e.strerror}") from None
    return next((kind for magic, kind in _MAGIC.items() if start.startswith(magic)), None)


def open_input(path) -> io.BufferedIOBase:
    """A binary file object over `path`, decompressing as it reads."""
    path = Path(path)
    kind = compression(path)
    if kind == "gzip":
        return gzip.open(path, "rb")
    if kind == "xz":
        return lzma.open(path, "rb")
    if kind == "zstd":
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True))
    return open(path, "rb")


def read_head(path) -> bytes:
    """The first HEAD_BYTES of the decompressed content (less for a shorter file)."""
    try:
        with open_input(path) as f:
            return f.read(HEAD_BYTES)
    except (OSError, EOFError, lzma.LZMAError) as e:
        raise TraceFormatError(path, f"cannot read: {e}") from None
