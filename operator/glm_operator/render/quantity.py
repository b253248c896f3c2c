"""Kubernetes quantities in canonical form.

The API server stores quantities canonicalised ("1.5Gi" reads back as "1536Mi", "0.5" as
"500m"). Rendering the canonical form directly lets a live object compare equal to the
intent, so a periodic drift check does not see a difference where there is none.
"""

from __future__ import annotations

from fractions import Fraction

_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20),
           ("Ki", 2**10))


def memory_quantity(num_bytes: int) -> str:
    """Bytes with the largest binary suffix that divides them exactly (4Gi, 1536Mi, 100)."""
    if num_bytes < 0:
        raise ValueError(f"a memory quantity cannot be negative: {num_bytes}")
    for suffix, size in _BINARY:
        if num_bytes and num_bytes % size == 0:
            return f"{num_bytes // size}{suffix}"
    return str(num_bytes)


def decimal_quantity(value: float | int) -> str:
    """A plain number: integers as is ("2"), fractions in milli-units ("1500m", "500m").

    Precision below one milli-unit is rounded up (Kubernetes rounds up too).
    """
    if value < 0:
        raise ValueError(f"a quantity cannot be negative: {value}")
    exact = Fraction(value).limit_denominator(10**9)
    if exact.denominator == 1:
        return str(exact.numerator)
    milli = -(-exact * 1000 // 1)  # ceil
    if milli % 1000 == 0:
        return str(milli // 1000)
    return f"{milli}m"


def cpu_quantity(cores: float) -> str:
    return decimal_quantity(cores)


def cpu_cores(quantity: str | int | float) -> float:
    """A CPU quantity as cores: "2" -> 2.0, "1500m" -> 1.5, 4 -> 4.0."""
    text = str(quantity).strip()
    try:
        if text.endswith("m"):
            return float(text[:-1]) / 1000
        return float(text)
    except ValueError:
        raise ValueError(f"not a CPU quantity: {quantity!r} (e.g. 2, 1.5 or 1500m)") from None
