"""Where built components are cached: one home, imported by the toolchain and by every
builder it calls (vLLM's venv, the Lua health checks), so none of them imports the toolchain
back."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    configured = os.environ.get("GLM_OPERATOR_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "glm-operator"
