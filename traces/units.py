"""Quantities in words for messages and tables: bytes in binary units; and the longest time
anything here may be asked to run or stretch a trace to."""

# A year: far inside the signed nanosecond clocks of the engine and the generators (292 years),
# which 1e308 s or inf would overflow; no capture, run or think time needs more.
YEAR_S = 365 * 86400

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def human_bytes(n: int | None, *, short: bool = False) -> str:
    """`n` bytes in binary units with one decimal: 536870912 -> "512.0 MiB", 100 -> "100 bytes".

    short=True is the trace tables' form: a whole value without its decimal ("512 MiB",
    "1.5 GiB"), "100 B", units up to TiB, and "-" for None (not known)."""
    if short and n is None:
        return "-"
    if (n if short else abs(n)) < 1024:
        return f"{n} B" if short else f"{n} bytes"
    units = _UNITS[:4] if short else _UNITS
    for power, unit in enumerate(units, 1):
        # Dividing by a power of two is exact, so this is the value rounded once.
        value = n / (1 << 10 * power)
        if abs(value) < 1024 or unit == units[-1]:
            break
    return f"{value:.0f} {unit}" if short and value == int(value) else f"{value:.1f} {unit}"
