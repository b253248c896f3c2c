"""The only code that talks to Prometheus: instant queries over its HTTP API."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


class PrometheusError(RuntimeError):
    """Prometheus could not answer; the message says which query and why."""


def query_scalar(base_url: str, promql: str, timeout: float) -> float | None:
    """The value of a query that yields one sample (a sum()); None when it yields none."""
    url = base_url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body: dict[str, Any] = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        raise PrometheusError(f"{base_url}: HTTP {exc.code} for {promql}: {detail}") from exc
    except (OSError, ValueError) as exc:
        raise PrometheusError(f"{base_url}: {exc} (query {promql})") from exc
    if body.get("status") != "success":
        raise PrometheusError(f"{base_url}: {body.get('error', body)} (query {promql})")
    result = body.get("data", {}).get("result", [])
    if not result:
        return None
    value = float(result[0]["value"][1])
    return value if not math.isnan(value) else None
