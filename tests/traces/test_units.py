"""Bytes in words: the messages' form ("512.0 MiB") and the trace tables' short form ("512 MiB")."""
import numpy as np
import pytest

from traces.units import human_bytes

MIB, GIB, TIB = 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize(
    "n, text",
    [
        (0, "0 bytes"),
        (1023, "1023 bytes"),
        (1024, "1.0 KiB"),
        (512 * MIB, "512.0 MiB"),
        (GIB, "1.0 GiB"),
        (3 * TIB // 2, "1.5 TiB"),
        (1 << 70, "1024.0 EiB"),
        (-5000, "-4.9 KiB"),
    ],
)
def test_human_bytes(n, text):
    assert human_bytes(n) == text


@pytest.mark.parametrize(
    "n, text",
    [
        (None, "-"),
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (np.int64(512 * MIB), "512 MiB"),
        (3 * GIB // 2, "1.5 GiB"),
        (2048 * TIB, "2048 TiB"),  # the tables stop at TiB
        (-5000, "-5000 B"),
    ],
)
def test_human_bytes_short(n, text):
    assert human_bytes(n, short=True) == text
