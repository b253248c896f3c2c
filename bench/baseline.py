"""The operator's package as of another git revision: the `--baseline` arm of the benches,
so a change is measured against the code before it in one run, on one machine."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def export_operator(ref: str, into: Path) -> Path:
    """`operator/` as of git `ref` under `into`; put the returned path on PYTHONPATH."""
    into.mkdir(parents=True, exist_ok=True)
    archive = into / "operator.tar"
    subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), ref, "operator"],
                   check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "operator"
