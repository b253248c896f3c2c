"""One JSON line per request, to stdout or a file.

Fields: ts (RFC 3339, UTC), request_id, key_id (sha256 prefix, never the key), service,
model_version, pool, endpoint, stream, status, error_code, prompt_tokens, completion_tokens,
duration_ms, ttft_ms, overflow; `prompt` and `completion` only with --audit-include-text.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

CLIENT_CLOSED = 499  # nginx's code for "the client went away": audit and metrics use it


@dataclass(slots=True)
class AuditRecord:
    """One request as the audit log writes it (and the metrics count it)."""

    request_id: str
    endpoint: str
    key_id: str = ""
    stream: bool = False
    status: int = 0
    error_code: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    duration_ms: float = 0.0
    ttft_ms: float | None = None
    overflow: bool = False
    prompt: Any = None
    completion: str | None = None


class AuditLog:
    def __init__(self, destination: str, static: dict[str, str], include_text: bool) -> None:
        self.include_text = include_text
        self._static = static
        self._owned: TextIO | None = None
        if destination == "off":
            self._out: TextIO | None = None
        elif destination == "stdout":
            self._out = sys.stdout
        else:
            self._owned = open(destination, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
            self._out = self._owned

    @property
    def enabled(self) -> bool:
        return self._out is not None

    def write(self, record: AuditRecord) -> None:
        if self._out is None:
            return
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z",
            "request_id": record.request_id,
            "key_id": record.key_id,
            **self._static,
            "endpoint": record.endpoint,
            "stream": record.stream,
            "status": record.status,
            "error_code": record.error_code,
            "prompt_tokens": record.prompt_tokens,
            "completion_tokens": record.completion_tokens,
            "duration_ms": round(record.duration_ms, 3),
            "ttft_ms": None if record.ttft_ms is None else round(record.ttft_ms, 3),
            "overflow": record.overflow,
        }
        if self.include_text:
            line["prompt"] = record.prompt
            line["completion"] = record.completion
        self._out.write(json.dumps(line, ensure_ascii=False) + "\n")
        if self._owned is None:
            self._out.flush()

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()
            self._owned = None
