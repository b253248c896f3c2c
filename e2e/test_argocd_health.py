"""Argo CD against the real operator on the local control plane.

Health: the statuses the operator really writes (a Ready service and ModelVersion, an
infeasible service, an infeasible change of a serving one, a missing ModelVersion, a canary
that is progressing, paused, aborted and then reverted, a ModelVersion whose fetch reported a
failure and one whose fetch Job failed) are captured, trimmed to the fields the scripts read,
and run through charts/argocd/argocd-cm.yaml by `luahealth eval`, which evaluates them as
Argo CD's controller does (e2e/luahealth).

Sync: the git manifests of examples/argocd/services, applied with Argo CD's field manager and
tracking annotation, show no difference against the live objects once the operator has
reconciled them (a server-side diff, as Argo CD's ServerSideDiff compares), and every child
the operator created is owned, so Argo CD never tracks or prunes it. The example Applications
are accepted by Argo CD's real Application CRD.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.fetch_helpers import run_fetch, write_served_gguf
from e2e.kubectl import Kubectl, KubectlError
from e2e.luahealth import build_for_tests, evaluate
from e2e.operator_fixtures import OperatorProcess, glm_crds, operator, report_fetched
from e2e.test_operator import (
    CPU_MV,
    CPU_SVC,
    condition,
    deploy_model,
    example,
    glms,
    serve_cpu_example,
    wait_condition,
    wait_ready,
)

__all__ = ["glm_crds", "operator"]  # fixtures used by name

REPO = Path(__file__).resolve().parent.parent
ARGOCD_EXAMPLES = REPO / "examples" / "argocd"
ARGOCD_MANAGER = "argocd-controller"  # the field manager of Argo CD's server-side apply
TRACKING = "argocd.argoproj.io/tracking-id"
Wait = Callable[..., Any]


@pytest.fixture(scope="module")
def luahealth() -> Path:
    return build_for_tests()


# --- capture and evaluate ----------------------------------------------------------------

def small(obj: dict[str, Any]) -> dict[str, Any]:
    """The object cut down to what the health scripts read."""
    meta = obj["metadata"]
    status = obj.get("status") or {}
    kept: dict[str, Any] = {k: status[k] for k in ("observedGeneration", "phase") if k in status}
    if status.get("rollout"):
        kept["rollout"] = {k: v for k, v in status["rollout"].items()
                           if k in ("phase", "modelVersion", "message")}
    kept["conditions"] = [{k: c[k] for k in ("type", "status", "reason", "message") if k in c}
                          for c in status.get("conditions", [])]
    trimmed: dict[str, Any] = {
        "apiVersion": obj["apiVersion"], "kind": obj["kind"],
        "metadata": {k: meta[k] for k in ("name", "namespace", "generation") if k in meta},
        "status": kept,
    }
    if "modelVersion" in obj.get("spec", {}):
        trimmed["spec"] = {"modelVersion": obj["spec"]["modelVersion"]}
    return trimmed


class Health:
    """Argo CD's health of live objects, from the scripts in argocd-cm."""

    def __init__(self, binary: Path, workdir: Path) -> None:
        self.binary, self.workdir = binary, workdir
        self.captured: list[dict[str, Any]] = []

    def of(self, obj: dict[str, Any]) -> dict[str, Any]:
        trimmed = small(obj)
        self.captured.append(trimmed)
        (self.workdir / "captured.yaml").write_text(yaml.safe_dump_all(self.captured))
        full, cut = evaluate(self.binary, [obj, trimmed], self.workdir)
        # The cut copy is what the test keeps; it must judge exactly as the whole object.
        assert (full["status"], full["message"]) == (cut["status"], cut["message"]), (full, cut)
        assert not cut.get("error"), cut
        return cut

    def expect(self, obj: dict[str, Any], status: str, *fragments: str) -> dict[str, Any]:
        result = self.of(obj)
        shown = yaml.safe_dump(small(obj), sort_keys=False)
        assert result["status"] == status, f"{result} for\n{shown}"
        for fragment in fragments:
            assert fragment in result["message"], f"{fragment!r} not in {result} for\n{shown}"
        return result


@pytest.fixture
def health(luahealth: Path, tmp_path: Path) -> Health:
    return Health(luahealth, tmp_path)


def modelversion(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any]:
    return kubectl.get_json("modelversion", name, "-n", ns)


def mv_ready(kubectl: Kubectl, ns: str, name: str, wait_for: Wait) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        obj = modelversion(kubectl, ns, name)
        cond = condition(obj, "Ready")
        return obj if cond and cond["status"] == "True" else None
    result: dict[str, Any] = wait_for(ready, timeout=60, what=f"ModelVersion {name} Ready=True")
    return result


def reconciled(kubectl: Kubectl, ns: str, name: str,
               check: Callable[[dict[str, Any]], bool]) -> Callable[[], dict[str, Any] | None]:
    """A wait_for predicate: the GLMService, once the operator has seen its latest spec and
    `check` holds."""
    def probe() -> dict[str, Any] | None:
        obj = glms(kubectl, ns, name)
        seen = obj.get("status", {}).get("observedGeneration") == obj["metadata"]["generation"]
        return obj if seen and check(obj) else None
    return probe


def rollout_phase(phase: str) -> Callable[[dict[str, Any]], bool]:
    return lambda obj: (obj.get("status", {}).get("rollout") or {}).get("phase") == phase


# --- health of what the operator writes ---------------------------------------------------

def test_ready_service_and_modelversion_are_healthy(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait,
        health: Health) -> None:
    name = serve_cpu_example(kubectl, namespace, wait_for)
    health.expect(glms(kubectl, namespace, name), "Healthy", "pods ready",
                  CPU_MV["metadata"]["name"])
    mv = mv_ready(kubectl, namespace, CPU_MV["metadata"]["name"], wait_for)
    health.expect(mv, "Healthy", "verified", "cached")


def test_infeasible_service_is_degraded_with_the_numbers(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait,
        health: Health) -> None:
    mv, svc = example("nvidia-a10-llamacpp")
    deploy_model(kubectl, namespace, mv, wait_for)
    huge = copy.deepcopy(svc)
    huge["spec"]["contextLength"] = 32768
    huge["spec"]["concurrency"] = 24
    kubectl.apply(huge, namespace=namespace)
    name = huge["metadata"]["name"]
    wait_condition(kubectl, namespace, name, "Planned", "False", wait_for)
    obj = wait_for(reconciled(kubectl, namespace, name,
                              lambda o: (condition(o, "Ready") or {}).get("status") == "False"),
                   what=f"GLMService {name} Ready=False")
    health.expect(obj, "Degraded", "does not fit", "GiB", "nvidia-a10")


def test_infeasible_change_of_a_serving_service_is_degraded(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait,
        health: Health) -> None:
    # The pods of the previous spec keep serving (Ready=True), but the committed spec cannot
    # run: Argo CD must not call that Healthy.
    name = serve_cpu_example(kubectl, namespace, wait_for)
    too_long = copy.deepcopy(CPU_SVC)
    too_long["spec"]["contextLength"] = 65536  # the model was trained for 32768
    kubectl.apply(too_long, namespace=namespace)
    obj = wait_for(reconciled(kubectl, namespace, name,
                              lambda o: (condition(o, "Planned") or {}).get("status") == "False"),
                   what=f"GLMService {name} Planned=False")
    assert (condition(obj, "Ready") or {}).get("status") == "True"
    health.expect(obj, "Degraded", "exceeds the model's trained context")


def test_missing_modelversion_is_progressing(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait,
        health: Health) -> None:
    # In a sync, the ModelVersion may only come in a later wave: not Degraded.
    kubectl.apply(CPU_SVC, namespace=namespace)
    name = CPU_SVC["metadata"]["name"]
    wait_condition(kubectl, namespace, name, "ModelReady", "False", wait_for)
    health.expect(glms(kubectl, namespace, name), "Progressing", CPU_MV["metadata"]["name"])


def test_canary_progressing_paused_aborted_then_reverted(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait,
        health: Health) -> None:
    name = serve_cpu_example(kubectl, namespace, wait_for)
    stable = CPU_MV["metadata"]["name"]
    stable_deployment = kubectl.items("deployments", "-n", namespace, "-l",
                                      f"glm-operator.dev/version={stable}")
    assert len(stable_deployment) == 1
    before = stable_deployment[0]["metadata"]["generation"]

    new_mv = copy.deepcopy(CPU_MV)
    new_mv["metadata"]["name"] = f"{stable}-next"
    target = deploy_model(kubectl, namespace, new_mv, wait_for)
    mv_ready(kubectl, namespace, target, wait_for)

    # The commit: a new spec.modelVersion, by canary. Prometheus is not configured here, so
    # the canary holds at its first step (AnalysisUnavailable): Progressing.
    canary = copy.deepcopy(CPU_SVC)
    canary["spec"]["modelVersion"] = target
    canary["spec"]["rollout"] = {"strategy": "canary", "steps": [50], "interval": "10m"}
    kubectl.apply(canary, namespace=namespace)
    obj = wait_for(reconciled(kubectl, namespace, name, rollout_phase("Progressing")),
                   timeout=60, what="the canary rollout to start")
    health.expect(obj, "Progressing")

    paused = copy.deepcopy(canary)
    paused["spec"]["rollout"]["paused"] = True
    kubectl.apply(paused, namespace=namespace)
    obj = wait_for(reconciled(kubectl, namespace, name, rollout_phase("Paused")),
                   timeout=60, what="the rollout Paused")
    health.expect(obj, "Suspended", "paused")

    kubectl.apply(canary, namespace=namespace)
    kubectl("annotate", "glmservice", name, "-n", namespace,
            f"rollout.glm-operator.dev/abort={target}")
    obj = wait_for(reconciled(kubectl, namespace, name, rollout_phase("Aborted")),
                   timeout=60, what="the rollout Aborted")
    health.expect(obj, "Degraded", "aborted", stable)

    # git revert: the spec as it was before the commit.
    kubectl.apply(CPU_SVC, namespace=namespace)

    def serving_stable(o: dict[str, Any]) -> bool:
        ready = condition(o, "Ready")
        return bool(ready and ready["status"] == "True"
                    and o["status"].get("stableModelVersion") == stable)
    obj = wait_for(reconciled(kubectl, namespace, name, serving_stable), timeout=60,
                   what="the reverted GLMService Ready on its stable version")
    health.expect(obj, "Healthy", stable)
    after = kubectl.get_json("deployment", stable_deployment[0]["metadata"]["name"],
                             "-n", namespace)["metadata"]["generation"]
    assert after == before, "reverting restarted the stable version's pods"


def test_modelversion_whose_fetch_reported_a_failure_is_degraded(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait,
        health: Health, tmp_path: Path) -> None:
    # The field reports' classic: a file whose header says llama where glm4 was expected.
    name = "glm4-mislabelled"
    kubectl.apply({
        "apiVersion": "serving.glm-operator.dev/v1alpha2", "kind": "ModelVersion",
        "metadata": {"name": name},
        "spec": {"source": {"uri": "pvc://models/glm4.gguf"}, "format": "gguf",
                 "quantization": "Q4_K_M", "architecture": "glm4"}}, namespace=namespace)
    job = wait_for(lambda: kubectl.items("jobs", "-n", namespace, "-l",
                                         f"glm-operator.dev/model-version={name}"),
                   timeout=60, what=f"the fetch Job of ModelVersion {name}")[0]
    health.expect(modelversion(kubectl, namespace, name), "Progressing")

    # kwok runs no containers: the Job's pod is played here, by the real fetcher with the
    # Job's own arguments and a token of the Job's ServiceAccount (as `make demo` does).
    write_served_gguf(tmp_path / "pvc" / "models" / "glm4.gguf", arch="llama", payload_mib=1)
    pod = job["spec"]["template"]["spec"]
    token = tmp_path / "token"
    token.write_text(kubectl("create", "token", pod["serviceAccountName"], "-n",
                             namespace).stdout.strip())
    server = json.loads(kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)[
        "clusters"][0]["cluster"]
    ca = tmp_path / "ca.crt"
    if "certificate-authority-data" in server:
        ca.write_bytes(base64.b64decode(server["certificate-authority-data"]))
    else:
        ca.write_bytes(Path(server["certificate-authority"]).read_bytes())
    args = pod["containers"][0]["args"]
    assert args[0] == "fetch", args
    run = run_fetch(*args[1:],
                    # where the pod's volumes are on this machine
                    "--dest", str(tmp_path / "cache"), "--pvc-root", str(tmp_path / "pvc"),
                    "--result-json", str(tmp_path / "result.json"),
                    "--api-server", server["server"], "--token-file", str(token),
                    "--api-ca-file", str(ca))
    assert run.code == 8, run.log  # WrongArchitecture

    def failed() -> dict[str, Any] | None:
        obj = modelversion(kubectl, namespace, name)
        ready = condition(obj, "Ready")
        return obj if (obj["status"].get("phase") == "Failed" and ready
                       and ready["reason"] == "WrongArchitecture") else None
    obj = wait_for(failed, timeout=60, what=f"ModelVersion {name} Failed, Ready=False")
    health.expect(obj, "Degraded", "general.architecture='llama'", "'glm4'")


def test_modelversion_whose_fetch_job_failed_is_degraded(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait,
        health: Health) -> None:
    # A Job that fails without the fetcher reporting (crash, image pull, deadline): the
    # operator's own FetchFailed. The cache claim names a StorageClass that does not exist,
    # so the Job's pod stays Pending (kwok would otherwise complete it at once).
    name = "glm4-unfetched"
    kubectl.apply({
        "apiVersion": "serving.glm-operator.dev/v1alpha2", "kind": "ModelVersion",
        "metadata": {"name": name},
        "spec": {"source": {"uri": "https://models.example.com/glm4.gguf"}, "format": "gguf",
                 "quantization": "Q4_K_M", "architecture": "glm4",
                 "cache": {"storageClassName": "e2e-no-such-class", "size": "1Gi"}}},
        namespace=namespace)
    job = wait_for(lambda: [j for j in kubectl.items("jobs", "-n", namespace, "-l",
                                                     f"glm-operator.dev/model-version={name}")
                            if j.get("status", {}).get("active")],
                   timeout=60, what=f"the active fetch Job of ModelVersion {name}")[0]
    # Its pods never run here; the Job controller is told what it concludes itself after
    # backoffLimit failed pods, and finishes the failure: pods removed, condition Failed.
    kubectl("patch", "job", job["metadata"]["name"], "-n", namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": {"conditions": [{
                "type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded",
                "message": "Job has reached the specified backoff limit"}]}}))

    def failed() -> dict[str, Any] | None:
        obj = modelversion(kubectl, namespace, name)
        ready = condition(obj, "Ready")
        return obj if (obj.get("status", {}).get("phase") == "Failed" and ready
                       and ready["reason"] == "FetchFailed") else None
    obj = wait_for(failed, timeout=60, what=f"ModelVersion {name} Failed (FetchFailed)")
    health.expect(obj, "Degraded", "fetch Job", "BackoffLimitExceeded")


# --- sync: nothing the operator writes is a diff --------------------------------------------

def _git_manifests(namespace: str) -> list[dict[str, Any]]:
    """examples/argocd/services as Argo CD applies them: with its tracking annotation."""
    objects = []
    for path in sorted((ARGOCD_EXAMPLES / "services").glob("*.yaml")):
        obj = yaml.safe_load(path.read_text())
        group = obj["apiVersion"].split("/")[0]
        annotations = obj["metadata"].setdefault("annotations", {})
        annotations[TRACKING] = (f"glm-services:{group}/{obj['kind']}:"
                                 f"{namespace}/{obj['metadata']['name']}")
        objects.append(obj)
    return objects


def test_reconciled_services_show_no_diff_against_git(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait,
        health: Health) -> None:
    manifests = _git_manifests(namespace)
    kubectl.apply(manifests, namespace=namespace, field_manager=ARGOCD_MANAGER,
                  force_conflicts=False)
    mv = next(o for o in manifests if o["kind"] == "ModelVersion")["metadata"]["name"]
    svc = next(o for o in manifests if o["kind"] == "GLMService")["metadata"]["name"]
    wait_for(lambda: kubectl.items("jobs", "-n", namespace, "-l",
                                   f"glm-operator.dev/model-version={mv}"),
             timeout=60, what=f"the fetch Job of ModelVersion {mv}")
    report_fetched(kubectl, namespace, mv)
    obj = wait_ready(kubectl, namespace, svc, wait_for)
    health.expect(obj, "Healthy")
    health.expect(mv_ready(kubectl, namespace, mv, wait_for), "Healthy")

    # The operator has written status, defaults are in place, children exist. A server-side
    # diff of git against the live objects (what Argo CD's ServerSideDiff computes):
    diff = kubectl("diff", "--server-side", f"--field-manager={ARGOCD_MANAGER}",
                   "-n", namespace, "-f", "-", input=yaml.safe_dump_all(manifests),
                   check=False)
    assert diff.returncode == 0, f"git differs from the live objects:\n{diff.stdout}{diff.stderr}"
    # ... and applying git again would not conflict with any field the operator owns.
    kubectl.apply(manifests, namespace=namespace, field_manager=ARGOCD_MANAGER,
                  force_conflicts=False)

    children = [o for kind in ("deployments", "services", "serviceaccounts", "roles",
                               "rolebindings", "jobs", "persistentvolumeclaims",
                               "horizontalpodautoscalers")
                for o in kubectl.items(kind, "-n", namespace, "-l",
                                       "app.kubernetes.io/managed-by=glm-operator")]
    assert {o["kind"] for o in children} >= {"Deployment", "Service", "Job",
                                              "PersistentVolumeClaim"}
    for child in children:
        meta = child["metadata"]
        where = f"{child['kind']} {meta['name']}"
        owners = {(r["kind"], r["name"]) for r in meta.get("ownerReferences", [])}
        assert owners & {("GLMService", svc), ("ModelVersion", mv)}, where
        assert TRACKING not in (meta.get("annotations") or {}), where


def test_example_applications_are_valid_argocd_applications(
        kubectl: Kubectl, namespace: str) -> None:
    paths = [ARGOCD_EXAMPLES / "root.yaml", *sorted((ARGOCD_EXAMPLES / "apps").glob("*.yaml"))]
    for path in paths:
        app = yaml.safe_load(path.read_text())
        app["metadata"].pop("namespace", None)
        try:
            kubectl("apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-",
                    input=yaml.safe_dump(app))
        except KubectlError as exc:
            raise AssertionError(f"{path.relative_to(REPO)}: {exc.stderr}") from exc
