"""The LeaderWorkerSets the operator renders, checked by the real API server against the real
LeaderWorkerSet CRD.

The CRD comes from the sigs.k8s.io/lws module (e2e/versions.toml), as its controller-gen wrote
it. It is installed under a group of its own (`leaderworkerset.e2e-check.glm-operator.dev`):
the schema is the published one, field for field, but the operators on this cluster look for
`leaderworkersets.leaderworkerset.x-k8s.io` and keep rendering StatefulSets for the other
tests. Every LeaderWorkerSet of the render goldens and of the multi-node examples (rendered
as the operator does when the CRD is served) goes through a server-side dry-run apply: the
API server must accept it with server-side apply, as the operator writes (types, enums,
required fields; a field the schema does not declare is refused), and give back everything
that was sent, unchanged (defaults it adds are fine). Controls prove the check sees an
unknown field and a refused value. (Its controller is not run here; see docs/planning.md.)
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from glm_operator.render.service import Capabilities

from e2e import toolchain
from e2e.examples import example_folders, render_example
from e2e.kubectl import Kubectl, KubectlError, wait_for

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "render" / "golden"
GROUP = "leaderworkerset.x-k8s.io"
CHECK_GROUP = "leaderworkerset.e2e-check.glm-operator.dev"
CRD_NAME = f"leaderworkersets.{CHECK_GROUP}"


def published_crd() -> dict[str, Any]:
    path = toolchain.ensure("lws") / "lws-leaderworkersets.yaml"
    crd: dict[str, Any] = yaml.safe_load(path.read_text())
    assert crd["spec"]["group"] == GROUP
    return crd


@pytest.fixture(scope="module")
def lws_crd(kubectl: Kubectl) -> Iterator[dict[str, Any]]:
    crd = published_crd()
    regrouped = copy.deepcopy(crd)
    regrouped["metadata"] = {"name": CRD_NAME}
    regrouped["spec"]["group"] = CHECK_GROUP
    # The conversion webhook (if any) belongs to LWS's controller, which is not run here.
    regrouped["spec"].pop("conversion", None)
    kubectl.apply(regrouped)

    def established() -> bool:
        # Right after creation the API server may show `conditions: null`.
        status = kubectl.get_json("crd", CRD_NAME).get("status") or {}
        conditions = status.get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)
    wait_for(established, timeout=60, what=f"CRD {CRD_NAME} Established")
    yield crd
    kubectl.run("delete", "crd", CRD_NAME, "--wait=false", "--ignore-not-found", check=False)


def golden_sets() -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted(GOLDEN.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "LeaderWorkerSet":
                found[f"{path.stem}:{doc['metadata']['name']}"] = doc
    return found


def example_sets() -> dict[str, dict[str, Any]]:
    found = {}
    for folder in example_folders():
        objects = render_example(
            folder, Capabilities(service_monitor=True, leader_worker_set=True))
        for obj in objects:
            if obj["kind"] == "LeaderWorkerSet":
                found[f"examples/{folder.name}:{obj['metadata']['name']}"] = obj
    return found


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, Any]]:
    found = {**golden_sets(), **example_sets()}
    assert any(c.startswith("examples/") for c in found) and len(found) >= 4, sorted(found)
    return found


def dry_run(kubectl: Kubectl, obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    sent = copy.deepcopy(obj)
    sent["apiVersion"] = sent["apiVersion"].replace(GROUP, CHECK_GROUP)
    sent["metadata"]["namespace"] = namespace
    sent["metadata"].pop("ownerReferences", None)  # owners that do not exist here
    done = kubectl("apply", "--server-side", "--field-manager=glm-operator",
                   "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(sent))
    returned: dict[str, Any] = json.loads(done.stdout)
    return returned


def missing_or_changed(sent: Any, returned: Any, path: str = "") -> list[str]:
    """Where `returned` lost or changed what `sent` had (defaults it added are fine)."""
    if isinstance(sent, dict):
        if not isinstance(returned, dict):
            return [f"{path}: {returned!r}"]
        out = []
        for key, value in sent.items():
            if key not in returned:
                out.append(f"{path}.{key} (pruned)")
            else:
                out += missing_or_changed(value, returned[key], f"{path}.{key}")
        return out
    if isinstance(sent, list):
        if not isinstance(returned, list) or len(returned) != len(sent):
            return [f"{path}: list {len(sent)} -> {returned!r:.60}"]
        return [d for i, (a, b) in enumerate(zip(sent, returned, strict=True))
                for d in missing_or_changed(a, b, f"{path}[{i}]")]
    # Quantities come back as the API server writes them; everything else exactly.
    return [] if sent == returned or str(sent) == str(returned) else [
        f"{path}: {sent!r} -> {returned!r}"]


def test_the_published_crd_serves_v1(lws_crd: dict[str, Any]) -> None:
    versions = {v["name"]: v for v in lws_crd["spec"]["versions"]}
    assert versions["v1"]["served"] and versions["v1"]["storage"]


def test_every_rendered_leader_worker_set_is_accepted_whole(
        kubectl: Kubectl, namespace: str, lws_crd: dict[str, Any],
        rendered: dict[str, dict[str, Any]]) -> None:
    problems = {}
    for case, obj in rendered.items():
        try:
            returned = dry_run(kubectl, obj, namespace)
        except KubectlError as exc:
            problems[case] = f"refused: {exc}"
            continue
        lost = missing_or_changed(obj["spec"], returned["spec"], "spec")
        if lost:
            problems[case] = lost
    assert problems == {}


def test_the_check_sees_an_unknown_field_and_a_refused_value(
        kubectl: Kubectl, namespace: str, lws_crd: dict[str, Any],
        rendered: dict[str, dict[str, Any]]) -> None:
    obj = copy.deepcopy(next(iter(rendered.values())))
    obj["spec"]["leaderWorkerTemplate"]["sizes"] = 3  # not a LeaderWorkerSet field
    # Server-side apply, as the operator writes, refuses it rather than pruning it.
    with pytest.raises(KubectlError, match=r"leaderWorkerTemplate\.sizes: field not declared"):
        dry_run(kubectl, obj, namespace)
    refused = copy.deepcopy(next(iter(rendered.values())))
    refused["spec"]["startupPolicy"] = "WhenEverybodyFeelsLikeIt"  # not in the enum
    with pytest.raises(KubectlError, match="startupPolicy"):
        dry_run(kubectl, refused, namespace)
