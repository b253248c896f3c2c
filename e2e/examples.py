"""The examples in examples/, rendered offline as the operator renders them (uids set, so
owner references are filled in)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from glm_operator.config import OperatorConfig
from glm_operator.render.service import Capabilities
from glm_operator.render_command import render_documents

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example_folders() -> list[Path]:
    """One service per folder (examples/argocd holds Argo CD Applications instead)."""
    return sorted(p.parent for p in EXAMPLES.glob("*/glmservice.yaml"))


def render_example(folder: Path, capabilities: Capabilities) -> list[dict[str, Any]]:
    docs = []
    for path in sorted(folder.glob("*.yaml")):
        for index, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                doc.setdefault("metadata", {}).setdefault("uid", f"uid-{index}")
                docs.append((f"{path.name}#{index}", doc))
    return render_documents(docs, OperatorConfig(), namespace="examples",
                            capabilities=capabilities)
