"""How a download's progress reads (`status.progress` of a ModelVersion), pure and shared:
the fetch Job writes the figures (fetch/progress.py), the operator marks them stopped when the
Job dies without a word (decide/model_version.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

_BINARY_UNITS = (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def _unit_for(n: float) -> tuple[str, int]:
    for name, size in _BINARY_UNITS:
        if n >= size:
            return name, size
    return "", 1


def _number(value: float) -> str:
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def format_bytes(n: float) -> str:
    """410Gi, 2.0Mi, 512 (Kubernetes quantity suffixes, so the column reads like `size`)."""
    unit, size = _unit_for(n)
    return _number(n / size) + unit if unit else str(int(n))


def format_amounts(done: int, total: int) -> str:
    """`152/410Gi`: both in the total's unit, so the fraction reads at a glance."""
    unit, size = _unit_for(total)
    if not unit:
        return f"{done}/{total}"
    return f"{_number(done / size)}/{_number(total / size)}{unit}"


def format_rate(bytes_per_second: float) -> str:
    """210MiB/s (IEC units, as download tools print a rate)."""
    unit, size = _unit_for(bytes_per_second)
    return f"{_number(bytes_per_second / size)}{unit}B/s" if unit else \
        f"{int(bytes_per_second)}B/s"


def format_duration(seconds: float) -> str:
    """45s, 22m, 3h05m, 2d04h: two units at most, rounded up (an ETA promises no less)."""
    total = max(0, math.ceil(seconds))
    if total < 60:
        return f"{total}s"
    minutes = math.ceil(total / 60)
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"



def stopped_status_progress(current: Any, now: datetime | None = None,
                            verb: str = "Stopped at") -> dict[str, Any] | None:
    """A ModelVersion's status.progress as last reported, marked as no longer moving (no
    rate, no ETA); None if there is none, or it was a finished download's.

    A failed fetch must not keep saying `Downloading ... ETA 5m` in the Progress column.
    Pure and on plain dicts: the operator marks a Job that died without reporting too."""
    if (not isinstance(current, Mapping) or "doneBytes" not in current
            or str(current.get("summary", "")).startswith("Downloaded")):
        return None
    done = int(current["doneBytes"])
    total = current.get("totalBytes")
    where = (f"{current.get('percent') or 0}% {format_amounts(done, int(total))}" if total
             else format_bytes(done))
    stamp = (now or datetime.now(UTC)).replace(microsecond=0)
    return {**current, "summary": f"{verb} {where}", "bytesPerSecond": None,
            "etaSeconds": None, "updateTime": stamp.strftime("%Y-%m-%dT%H:%M:%SZ")}
