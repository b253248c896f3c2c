"""Golden-file comparison: UPDATE_GOLDEN=1 rewrites the files, otherwise a diff fails."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).parent / "golden"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN_DIR / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"{path} is missing: run with UPDATE_GOLDEN=1 to create it")
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(
            expected.splitlines(keepends=True), text.splitlines(keepends=True),
            fromfile=f"golden/{name}", tofile="rendered"))
        pytest.fail(f"rendered output differs from golden/{name} "
                    f"(UPDATE_GOLDEN=1 to accept):\n{diff}")
