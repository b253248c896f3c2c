"""`glm-operator render` prints what the operator's own decisions give (issue 37): the kinds
of each routing mode, the mesh routes when the cluster serves Istio's CRDs, the inference
gateway's objects when it serves theirs, a canary's two versions, and what it assumed.

e2e/test_render_matches_operator.py holds the output equal to what the running operator
applies; these are the fast checks of which kinds appear."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from glm_operator.api import GLMService
from glm_operator.cli import main
from glm_operator.config import OperatorConfig
from glm_operator.decide.observed import ServiceObservation
from glm_operator.decide.service import decide_service
from glm_operator.render.capabilities import OPTIONAL_CRDS, capabilities_of
from glm_operator.render.inference_pool import INFERENCE_GATEWAY_CRDS
from glm_operator.render.service import Capabilities
from glm_operator.render_command import OFFLINE_UID, render_documents, served_crds
from render.cases import MODEL_VERSIONS, service_manifest

ENGINE_KINDS = ["Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"]
ROUTER_KINDS = ["ConfigMap", "ServiceAccount", "Role", "RoleBinding", "ConfigMap",
                "Deployment", "Service", "ServiceAccount", "Role", "RoleBinding",
                "PodDisruptionBudget", "Deployment"]
PICKER_KINDS = ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service"]
ROUTINGS: dict[str, dict[str, Any]] = {
    "Service": {},
    "EndpointPicker": {"routing": {"mode": "EndpointPicker"}},
    "InferenceGateway": {"routing": {"mode": "InferenceGateway",
                                     "gatewayRef": {"name": "inference"}}},
}


def mv_manifest(key: str = "gguf", name: str | None = None) -> dict[str, Any]:
    data = MODEL_VERSIONS[key]
    return {"apiVersion": "serving.glm-operator.dev/v1alpha1", "kind": "ModelVersion",
            "metadata": {"name": name or data["name"]}, "spec": data["spec"]}


def svc_manifest(**spec: Any) -> dict[str, Any]:
    manifest = service_manifest("llamacpp", "a10", autoscaling={
        "minReplicas": 1, "maxReplicas": 3, "targets": {"queueLength": 2}}, **spec)
    manifest["metadata"] = {"name": "chat"}  # as written in git: no namespace, no uid
    return manifest


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return [d["kind"] for d in docs]


def rendered(*docs: dict[str, Any], crds: tuple[str, ...] = (),
             notes: list[str] | None = None) -> list[dict[str, Any]]:
    return render_documents([(f"doc {i}", d) for i, d in enumerate(docs)], OperatorConfig(),
                            namespace="prod",
                            capabilities=capabilities_of(served_crds(list(crds))),
                            model_version_children=False, notes=notes)


# What the operator applies in each routing mode, by the CRDs its cluster serves.
CASES = [
    ("Service", (), ENGINE_KINDS),
    ("Service", ("istio",), [*ENGINE_KINDS, "DestinationRule", "VirtualService"]),
    ("EndpointPicker", (), ["Deployment", "Service", "Service", "PodDisruptionBudget",
                            "HorizontalPodAutoscaler", *ROUTER_KINDS]),
    # The router splits the versions: no VirtualService beside it.
    ("EndpointPicker", ("istio",), ["Deployment", "Service", "Service", "PodDisruptionBudget",
                                    "HorizontalPodAutoscaler", *ROUTER_KINDS]),
    # Without the Inference Extension's CRDs: no pool, route nor picker (the operator says so).
    ("InferenceGateway", ("istio",), ENGINE_KINDS),
    ("InferenceGateway", ("inference-extension", "gateway-api"),
     [*ENGINE_KINDS, *PICKER_KINDS, "InferencePool", "HTTPRoute"]),
    # With Istio too, the picker's DestinationRule (TLS to the picker); still no
    # VirtualService: the HTTPRoute is the one writer of the weights.
    ("InferenceGateway", ("istio", "inference-extension", "gateway-api"),
     [*ENGINE_KINDS, *PICKER_KINDS, "DestinationRule", "InferencePool", "HTTPRoute"]),
]


@pytest.mark.parametrize(("mode", "cluster", "expected"), CASES,
                         ids=[f"{m}-{'+'.join(c) or 'plain'}" for m, c, _ in CASES])
def test_each_routing_mode_prints_the_kinds_the_operator_applies(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str,
        cluster: tuple[str, ...], expected: list[str]) -> None:
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all([svc_manifest(**ROUTINGS[mode]), mv_manifest()]))
    flags = ["--cluster-has", ",".join(cluster)] if cluster else []
    assert main(["render", "-f", str(path), "--no-model-version-children", *flags]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("# glm-operator render: for a cluster serving "
                              + (", ".join(cluster) if cluster else "none of the optional"))
    assert kinds(list(yaml.safe_load_all(out.out))) == expected
    if mode == "InferenceGateway" and "gateway-api" not in cluster:
        assert "InferenceGatewayCRDsMissing" in out.err  # the note says why there is no pool


def test_the_objects_are_those_of_the_controllers_decision() -> None:
    """Render is decide_service observing no live children: no second assembly to drift."""
    svc, mv = svc_manifest(**ROUTINGS["InferenceGateway"]), mv_manifest()
    caps = capabilities_of(OPTIONAL_CRDS)
    body = {**svc, "metadata": {"name": "chat", "namespace": "prod", "uid": "u-1"}}
    now = datetime(2026, 1, 1, tzinfo=UTC)
    decision = decide_service(ServiceObservation(
        service=GLMService.model_validate(body),
        model_versions={mv["metadata"]["name"]: {
            **mv, "metadata": {**mv["metadata"], "namespace": "prod"},
            "status": {"phase": "Ready"}}},
        capabilities=caps, now=now), OperatorConfig(), OperatorConfig().profiles)
    out = render_documents([("svc", body), ("mv", mv)], OperatorConfig(), namespace="prod",
                           capabilities=caps, model_version_children=False, now=now)
    assert out == decision.desired
    assert all(r["uid"] == "u-1" for o in out for r in o["metadata"]["ownerReferences"])


def test_a_canary_in_progress_prints_both_versions_and_their_weights() -> None:
    """A GLMService read back mid-rollout (its status says stable v1, step 1 at 25 %)."""
    now = datetime.now(UTC).isoformat()
    svc = svc_manifest(rollout={"strategy": "canary", "steps": [25, 75], "interval": "1h"})
    svc["spec"]["modelVersion"] = "v2"
    svc["status"] = {"stableModelVersion": "v1", "rollout": {
        "strategy": "canary", "modelVersion": "v2", "fromModelVersion": "v1",
        "phase": "Progressing", "step": 1, "weight": 25, "startedTime": now,
        "stepStartedTime": now, "progressTime": now}}
    out = rendered(svc, mv_manifest(name="v1"), mv_manifest(name="v2"), crds=("istio",))
    deployments = sorted(o["metadata"]["name"] for o in out if o["kind"] == "Deployment")
    assert deployments == ["chat-v1", "chat-v2"]
    # The canary is sized to its step; the stable version keeps its autoscaler.
    hpas = [o["metadata"]["name"] for o in out if o["kind"] == "HorizontalPodAutoscaler"]
    assert hpas == ["chat-v1"]
    route = next(o for o in out if o["kind"] == "VirtualService")["spec"]["http"][-1]["route"]
    assert {r["destination"]["subset"]: r["weight"] for r in route} == {"v1": 75, "v2": 25}


def test_a_service_the_operator_would_not_serve_is_an_error_with_its_condition(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mv = mv_manifest()
    mv["status"] = {"phase": "Fetching"}  # read back from a cluster before the fetch ended
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all([svc_manifest(), mv]))
    assert main(["render", "-f", str(path)]) == 1
    assert "ModelReady=False (ModelVersionNotReady)" in capsys.readouterr().err


def test_api_resources_output_names_the_served_crds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    listing = tmp_path / "api-resources.txt"
    listing.write_text("pods\ndeployments.apps\nvirtualservices.networking.istio.io\n"
                       "destinationrules.networking.istio.io\n"
                       + "".join(f"{crd}\n" for crd in INFERENCE_GATEWAY_CRDS))
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all([svc_manifest(**ROUTINGS["InferenceGateway"]),
                                        mv_manifest()]))
    assert main(["render", "-f", str(path), "--api-resources", str(listing),
                 "--no-model-version-children"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# glm-operator render: for a cluster serving istio, "
                          "inference-extension, gateway-api\n")
    assert {"InferencePool", "HTTPRoute"} <= set(kinds(list(yaml.safe_load_all(out))))


def test_an_unknown_cluster_capability_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all([svc_manifest(), mv_manifest()]))
    assert main(["render", "-f", str(path), "--cluster-has", "istio,linkerd"]) == 1
    assert "'linkerd' is none of istio, servicemonitor" in capsys.readouterr().err


def test_offline_owner_references_are_left_out_and_uids_from_a_cluster_kept() -> None:
    out = rendered(svc_manifest(), mv_manifest())
    assert all("ownerReferences" not in o["metadata"] for o in out)
    assert OFFLINE_UID not in yaml.safe_dump_all(out)


def test_the_operator_and_render_build_capabilities_alike() -> None:
    assert capabilities_of(()) == Capabilities()
    assert capabilities_of(OPTIONAL_CRDS) == Capabilities(
        service_monitor=True, istio=True, keda=True, leader_worker_set=True,
        inference_crds=frozenset(INFERENCE_GATEWAY_CRDS))
    # Istio's split needs both of its CRDs.
    assert not capabilities_of(["virtualservices.networking.istio.io"]).istio
