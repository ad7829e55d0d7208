"""The one formatter of quantities the app shows: bytes, seconds and FLOPs in the unit their
magnitude calls for, so a small model never reads "0.00 GB" and a large one never "81920 MiB".

Bytes use binary units (KiB, MiB, GiB: what device memory is sized in); three significant
digits everywhere.  :func:`scale` picks one unit for a whole figure axis.

>>> bytes_(0), bytes_(512), bytes_(3 * 2**20), bytes_(1.5 * 2**30)
('0 B', '512 B', '3.00 MiB', '1.50 GiB')
>>> seconds(4.06e-3), seconds(2.5e-6), seconds(12.0)
('4.06 ms', '2.50 µs', '12.0 s')
>>> flops(3.1e6), flops(2.2e12)
('3.10 MFLOP', '2.20 TFLOP')
>>> of(580 * 2**10, 16 * 2**30)
'580 KiB of 16.0 GiB'
"""

from __future__ import annotations

import math

BYTE_UNITS = (("B", 1), ("KiB", 2 ** 10), ("MiB", 2 ** 20), ("GiB", 2 ** 30), ("TiB", 2 ** 40))
TIME_UNITS = (("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0))
FLOP_UNITS = (("FLOP", 1), ("kFLOP", 1e3), ("MFLOP", 1e6), ("GFLOP", 1e9), ("TFLOP", 1e12),
              ("PFLOP", 1e15))


def _num(x: float) -> str:
    """Three significant digits without an exponent."""
    a = abs(x)
    if a == 0:
        return "0"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def scale(value: float, units=BYTE_UNITS) -> tuple:
    """``(unit name, divisor)`` for ``value``: the largest unit it is at least one of (the
    smallest unit for 0)."""
    v = abs(float(value or 0.0))
    name, div = units[0]
    for n, d in units:
        if v >= d * (1 - 1e-12):
            name, div = n, d
    if v and v < units[0][1]:           # below the smallest unit (e.g. 0.3 ns)
        name, div = units[0]
    return name, div


def quantity(value, units) -> str:
    """``value`` in the unit of ``units`` its magnitude calls for; ``–`` for no value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    value = float(value)
    if value == 0:
        return f"0 {units[0][0]}"
    name, div = scale(value, units)
    if name == "B":
        return f"{value:.0f} B"
    return f"{_num(value / div)} {name}"


def bytes_(b) -> str:
    """Bytes in B / KiB / MiB / GiB / TiB."""
    return quantity(b, BYTE_UNITS)


def seconds(s) -> str:
    """Seconds in ns / µs / ms / s."""
    if s is not None and float(s) == 0:
        return "0 s"
    return quantity(s, TIME_UNITS)


def flops(f) -> str:
    """Floating-point operations in FLOP / kFLOP / … / PFLOP."""
    return quantity(f, FLOP_UNITS)


def of(part, whole) -> str:
    """``"<part> of <whole>"`` in bytes, each in its own unit."""
    return f"{bytes_(part)} of {bytes_(whole)}"


def percent(part, whole) -> str:
    """``part / whole`` as a whole percentage (``–`` when ``whole`` is 0, ``<1 %`` for a
    sliver, never a misleading ``0 %``)."""
    if not whole:
        return "–"
    p = 100 * float(part) / float(whole)
    return "<1 %" if 0 < p < 0.5 else f"{p:.0f} %"


__all__ = ["BYTE_UNITS", "TIME_UNITS", "FLOP_UNITS", "scale", "quantity", "bytes_", "seconds",
           "flops", "of", "percent"]
