"""Every example in examples/ renders offline, and every rendered object keeps the invariants."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from glm_operator.config import OperatorConfig
from glm_operator.render.service import Capabilities
from glm_operator.render_command import render_documents

from render.invariants import problems

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# One service per folder (examples/argocd holds Argo CD Applications, checked elsewhere).
EXAMPLE_DIRS = sorted(p.parent for p in EXAMPLES.glob("*/glmservice.yaml"))


def test_there_are_examples_per_accelerator_kind() -> None:
    names = " ".join(p.name for p in EXAMPLE_DIRS)
    for kind in ("nvidia", "ascend", "cpu"):
        assert kind in names, f"examples/ has no {kind} example"


@pytest.mark.parametrize("example", EXAMPLE_DIRS, ids=lambda p: p.name)
def test_example_renders_and_keeps_the_invariants(example: Path) -> None:
    docs = []
    for path in sorted(example.glob("*.yaml")):
        for index, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                docs.append((f"{path.name}#{index}", doc))
    # Rendered as the operator would (uids set) so owner references are checked too.
    for _, doc in docs:
        doc.setdefault("metadata", {}).setdefault("uid", f"uid-{doc['metadata']['name']}")
    objects = render_documents(docs, OperatorConfig(), namespace="examples",
                               capabilities=Capabilities(service_monitor=True))
    kinds = {o["kind"] for o in objects}
    # A multi-node example's pool is StatefulSets (one group of pods per replica).
    pool = "StatefulSet" if "multinode" in example.name else "Deployment"
    assert {pool, "Service", "Job", "PersistentVolumeClaim"} <= kinds
    assert problems(objects) == []
