"""`glm-operator render` prints what the running operator applies (issue 37).

For every example under examples/, in every routing mode (Service, EndpointPicker,
InferenceGateway), and for a canary in progress: the inputs are applied, the operator (the
real `glm-operator run`, scoped to this module's namespaces) reconciles them, and the
children it owns are compared with `glm-operator render`'s output for the same inputs, run
as a command, told the cluster's optional CRDs with `--api-resources` (this cluster serves
Istio's, the Prometheus Operator's, KEDA's, the Inference Extension's and Gateway API's).

"The same inputs": the GLMService as applied, with the uid the API server gave it (so the
ownerReferences can be compared too), and the ModelVersions as read back, whose status
(Ready, size, facts) is what the fetch Job reported and what the operator planned with. The
canary's GLMService is read back whole: its status (stable version, rollout step) is input.

Equal means: the same (kind, name) set, including the ModelVersions' children; and for each
object, the operator's intent hash (decide/drift.py: a hash of every field it sets, server-set
metadata and status left out) on the live object equals the hash of what render printed, and
the live object holds every rendered field. Fields the API server sets or defaults (uid,
resourceVersion, managedFields, creationTimestamp, status, a Deployment's strategy) are thus
not compared, and a field render prints that the operator does not apply, or the reverse,
fails.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from glm_operator.decide.drift import drift, intent_hash, with_intent_hash
from glm_operator.wellknown import INTENT_HASH_ANNOTATION

from e2e.examples import example_folders
from e2e.inference_crds import inference_crds
from e2e.kubectl import Kubectl, wait_for
from e2e.operator_fixtures import (
    OperatorProcess,
    glm_crds,
    prefixed_namespace,
    report_fetched,
)

__all__ = ["glm_crds", "inference_crds"]  # fixtures used by name

REPO = Path(__file__).resolve().parent.parent
PREFIX = "render-"  # the namespaces this module's operator watches
MODEL_VERSION_LABEL = "glm-operator.dev/model-version"
ROUTINGS: dict[str, dict[str, Any] | None] = {
    "Service": None,
    "EndpointPicker": {"mode": "EndpointPicker"},
    # Nobody runs this Gateway: the operator writes the pools and the route all the same.
    "InferenceGateway": {"mode": "InferenceGateway", "gatewayRef": {"name": "inference"}},
}
# Every kind the operator may create for a GLMService or a ModelVersion (render/,
# controllers/apply.py's optional kinds); test_every_owned_kind_is_listed checks none is
# missing from what is compared.
CHILD_RESOURCES = (
    "deployments.apps", "statefulsets.apps", "services", "configmaps", "serviceaccounts",
    "roles.rbac.authorization.k8s.io", "rolebindings.rbac.authorization.k8s.io",
    "poddisruptionbudgets.policy", "horizontalpodautoscalers.autoscaling",
    "networkpolicies.networking.k8s.io", "leases.coordination.k8s.io", "jobs.batch",
    "persistentvolumeclaims", "servicemonitors.monitoring.coreos.com",
    "virtualservices.networking.istio.io", "destinationrules.networking.istio.io",
    "scaledobjects.keda.sh", "inferencepools.inference.networking.k8s.io",
    "httproutes.gateway.networking.k8s.io",
)
CONVERGE_SECONDS = 180

Obj = dict[str, Any]
Key = tuple[str, str]


@pytest.fixture(scope="module")
def render_operator(glm_crds: list[str], inference_crds: list[str],
                    kubectl: Kubectl) -> Iterator[OperatorProcess]:
    process = OperatorProcess(kubectl, namespaces=(f"{PREFIX}*",))
    try:
        wait_for(process.alive, timeout=60, what="glm-operator liveness endpoint")
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def api_resources(kubectl: Kubectl, inference_crds: list[str]) -> Iterator[Path]:
    """Where the cluster's `kubectl api-resources -o name` is written before each render,
    as a user would hand it over. Read afresh each time: other modules of a session install
    and delete third-party CRDs, and the operator sees those changes within
    capabilityRecheckSeconds."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as out:
        pass
    yield Path(out.name)
    Path(out.name).unlink(missing_ok=True)


@pytest.fixture
def ns(request: pytest.FixtureRequest, kubectl: Kubectl,
       render_operator: OperatorProcess) -> Iterator[str]:
    def explain(name: str) -> None:
        print(f"\n--- operator log ---\n{render_operator.tail(120)}")

    with prefixed_namespace(request, kubectl, PREFIX, explain) as name:
        yield name


# ------------------------------------------------------------------------------ helpers


def example(folder: Path) -> tuple[list[Obj], Obj]:
    """(ModelVersions, GLMService) of an example folder."""
    docs = [d for p in sorted(folder.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text())
            if d]
    mvs = [d for d in docs if d["kind"] == "ModelVersion"]
    svc = next(d for d in docs if d["kind"] == "GLMService")
    return mvs, svc


def fetched(kubectl: Kubectl, ns: str, mv: Obj) -> None:
    """Applied, its fetch Job created by the operator, and reported fetched (what the fetch
    Job writes; kwok pods run nothing)."""
    name = mv["metadata"]["name"]
    kubectl.apply(mv, namespace=ns)
    wait_for(lambda: kubectl.items("jobs", "-n", ns, "-l", f"{MODEL_VERSION_LABEL}={name}"),
             timeout=90, what=f"the fetch Job of ModelVersion {name}")
    declared = (mv["spec"].get("facts") or {}).get("sizeBytes")
    if declared:
        report_fetched(kubectl, ns, name, size=int(declared))
    else:
        report_fetched(kubectl, ns, name)


def owned_children(kubectl: Kubectl, ns: str, owners: set[str],
                   resources: tuple[str, ...] = CHILD_RESOURCES) -> dict[Key, Obj]:
    items = kubectl.items(",".join(resources), "-n", ns)
    return {(o["kind"], o["metadata"]["name"]): o for o in items
            if any(r.get("uid") in owners for r in o["metadata"].get("ownerReferences", []))}


def render(kubectl: Kubectl, inputs: list[Obj], api_resources: Path, ns: str) -> list[Obj]:
    """`glm-operator render` as a user runs it, told what the cluster serves now."""
    api_resources.write_text(kubectl("api-resources", "-o", "name").stdout)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as out:
        out.write(yaml.safe_dump_all(inputs))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "glm_operator.cli", "render", "-f", out.name,
             "--api-resources", str(api_resources), "-n", ns],
            capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    finally:
        Path(out.name).unlink(missing_ok=True)
    assert done.returncode == 0, f"glm-operator render failed:\n{done.stderr}"
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _shown(obj: Obj) -> str:
    meta = {k: v for k, v in obj.get("metadata", {}).items()
            if k not in ("uid", "resourceVersion", "creationTimestamp", "managedFields",
                         "generation")}
    return yaml.safe_dump({**{k: v for k, v in obj.items() if k != "status"},
                           "metadata": meta}, sort_keys=True)


def differences(rendered: list[Obj], live: dict[Key, Obj]) -> list[str]:
    """What render and the operator disagree on; [] when render printed what was applied."""
    want = {(o["kind"], o["metadata"]["name"]): o for o in rendered}
    found = [f"{k[0]} {k[1]}: rendered, but the operator did not apply it"
             for k in sorted(want.keys() - live.keys())]
    found += [f"{k[0]} {k[1]}: applied by the operator, but not rendered"
              for k in sorted(live.keys() - want.keys())]
    for key in sorted(want.keys() & live.keys()):
        why = drift(with_intent_hash(want[key]), live[key])
        if why is not None:
            applied = live[key]["metadata"].get("annotations", {}).get(INTENT_HASH_ANNOTATION)
            found.append(f"{key[0]} {key[1]}: {why} (intent hash applied {applied}, rendered "
                         f"{intent_hash(want[key])})\n--- rendered\n{_shown(want[key])}"
                         f"--- live\n{_shown(live[key])}")
    return found


def assert_render_matches(kubectl: Kubectl, ns: str, inputs: Any, api_resources: Path,
                          owners: set[str]) -> list[Obj]:
    """Wait until the operator's children settle to what render prints, else fail with
    every difference. `inputs()` gives render's input documents (read when compared)."""
    last: list[str] = []
    rendered: list[Obj] = []
    deadline = time.monotonic() + CONVERGE_SECONDS
    while time.monotonic() < deadline:
        rendered = render(kubectl, inputs(), api_resources, ns)
        last = differences(rendered, owned_children(kubectl, ns, owners))
        if not last:
            break
        time.sleep(3)
    assert not last, ("render and the operator differ after "
                      f"{CONVERGE_SECONDS}s:\n" + "\n".join(last))
    return rendered


def applied_as(svc: Obj, ns: str, uid: str) -> Obj:
    """The GLMService as applied, with the uid the API server gave it."""
    out = copy.deepcopy(svc)
    out["metadata"].update({"namespace": ns, "uid": uid})
    return out


# -------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("routing", sorted(ROUTINGS))
@pytest.mark.parametrize("folder", example_folders(), ids=lambda p: p.name)
def test_render_prints_what_the_operator_applies(
        kubectl: Kubectl, ns: str, api_resources: Path, folder: Path, routing: str) -> None:
    mvs, svc = example(folder)
    if ROUTINGS[routing] is not None:
        svc["spec"]["routing"] = ROUTINGS[routing]
    for mv in mvs:
        fetched(kubectl, ns, mv)
    kubectl.apply(svc, namespace=ns)
    name = svc["metadata"]["name"]
    uid = kubectl.get_json("glmservice", name, "-n", ns)["metadata"]["uid"]
    mv_uids = {m["metadata"]["uid"] for m in kubectl.items("modelversions", "-n", ns)}

    def inputs() -> list[Obj]:
        return [applied_as(svc, ns, uid), *kubectl.items("modelversions", "-n", ns)]

    rendered = assert_render_matches(kubectl, ns, inputs, api_resources, {uid, *mv_uids})
    kinds = {o["kind"] for o in rendered}
    # The cluster serves Istio's CRDs: Service mode routes through the mesh; the router and
    # the inference gateway carry the weights themselves.
    assert ("VirtualService" in kinds) == (routing == "Service"), kinds
    assert ({"InferencePool", "HTTPRoute"} <= kinds) == (routing == "InferenceGateway"), kinds


def test_every_owned_kind_is_listed(kubectl: Kubectl, ns: str, api_resources: Path) -> None:
    """The comparisons above list CHILD_RESOURCES only: here every namespaced kind is
    listed, for a service with a long-context pool, routed by the inference gateway."""
    mvs, svc = example(REPO / "examples" / "nvidia-a100-80gb-vllm-tp2")
    svc["spec"]["routing"] = ROUTINGS["InferenceGateway"]
    for mv in mvs:
        fetched(kubectl, ns, mv)
    kubectl.apply(svc, namespace=ns)
    uid = kubectl.get_json("glmservice", svc["metadata"]["name"], "-n", ns)["metadata"]["uid"]
    owners = {uid, *(m["metadata"]["uid"] for m in kubectl.items("modelversions", "-n", ns))}

    def inputs() -> list[Obj]:
        return [applied_as(svc, ns, uid), *kubectl.items("modelversions", "-n", ns)]

    assert_render_matches(kubectl, ns, inputs, api_resources, owners)
    every = tuple(kubectl("api-resources", "--namespaced", "--verbs=list", "-o",
                          "name").stdout.split())
    everything = owned_children(kubectl, ns, owners, every)
    listed = owned_children(kubectl, ns, owners)
    assert everything.keys() == listed.keys()


CANARY = {"strategy": "canary", "steps": [25, 75], "interval": "1h"}


def test_a_canary_in_progress_renders_both_versions_and_the_mesh_weights(
        kubectl: Kubectl, ns: str, api_resources: Path) -> None:
    """Mid-rollout the GLMService's status is input too: it is read back whole. The step
    holds (its interval is an hour and no analysis is configured), so the operator's
    children stay put while render is compared with them."""
    mvs, svc = example(REPO / "examples" / "cpu-llamacpp")
    mv = mvs[0]
    # The e2e volumes offer every access mode; RWX keeps the two versions' pods off one node.
    mv["spec"].setdefault("cache", {})["accessMode"] = "ReadWriteMany"
    versions = []
    for version in ("v1", "v2"):
        copy_ = copy.deepcopy(mv)
        copy_["metadata"]["name"] = version
        versions.append(copy_)
    svc["spec"].update({"modelVersion": "v1", "replicas": 2, "rollout": CANARY})
    name = svc["metadata"]["name"]
    fetched(kubectl, ns, versions[0])
    kubectl.apply(svc, namespace=ns)
    wait_for(lambda: kubectl.get_json("glmservice", name, "-n", ns).get("status", {})
             .get("stableModelVersion") == "v1", timeout=180, what="v1 stable")
    fetched(kubectl, ns, versions[1])
    svc["spec"]["modelVersion"] = "v2"
    kubectl.apply(svc, namespace=ns)
    wait_for(lambda: (kubectl.get_json("glmservice", name, "-n", ns).get("status", {})
                      .get("rollout") or {}).get("weight") == 25,
             timeout=180, what="the canary at 25 %")
    body = kubectl.get_json("glmservice", name, "-n", ns)
    owners = {body["metadata"]["uid"],
              *(m["metadata"]["uid"] for m in kubectl.items("modelversions", "-n", ns))}

    def inputs() -> list[Obj]:
        return [kubectl.get_json("glmservice", name, "-n", ns),
                *kubectl.items("modelversions", "-n", ns)]

    rendered = assert_render_matches(kubectl, ns, inputs, api_resources, owners)
    route = next(o for o in rendered if o["kind"] == "VirtualService")
    weights = {r["destination"]["subset"]: r["weight"] for r in route["spec"]["http"][-1]["route"]}
    assert weights == {"v1": 75, "v2": 25}, json.dumps(route["spec"])
    assert {o["metadata"]["name"] for o in rendered if o["kind"] == "Deployment"} == {
        f"{name}-v1", f"{name}-v2"}
