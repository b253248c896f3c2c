"""Talking to a llama-server a test started in a container: its /health and /completion."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any


def wait_healthy(port: int, seconds: float) -> int:
    """Poll http://127.0.0.1:<port>/health until 200 or `seconds` pass; the last status (0:
    no answer)."""
    deadline = time.monotonic() + seconds
    status = 0
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health",
                                        timeout=5) as response:
                status = response.status
        except (urllib.error.URLError, ConnectionError):
            status = 0
        if status == 200:
            break
        time.sleep(1)
    return status


def complete(port: int, prompt: str, n_predict: int, timeout: float = 60) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion",
        data=json.dumps({"prompt": prompt, "n_predict": n_predict}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer: dict[str, Any] = json.load(response)
    return answer
