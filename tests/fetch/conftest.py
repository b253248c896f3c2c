"""Fixtures for the fetcher's unit tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gguf_files import GLM4_KEYS, GLM4MOE_KEYS, LLAMA_KEYS, MakeGGUF, write_gguf


@pytest.fixture
def make_gguf(tmp_path: Path) -> MakeGGUF:
    def make(arch: str = "glm4", keys: dict[str, Any] | None = None, name: str | None = None,
             **kwargs: Any) -> Path:
        defaults = {"glm4": GLM4_KEYS, "glm4moe": GLM4MOE_KEYS, "llama": LLAMA_KEYS}
        chosen = defaults.get(arch, {}) if keys is None else keys
        return write_gguf(tmp_path / (name or f"{arch}.gguf"), arch, chosen, **kwargs)
    return make
