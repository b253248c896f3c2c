"""KEDA instead of the plain HPA, on the local control plane with KEDA's real ScaledObject CRD
(github.com/kedacore/keda/v2, installed by e2e/cluster.py).

The operator applies its ScaledObject by server-side apply, so the API server validates it
against the real CRD schema; a switch between HPA and KEDA leaves exactly one scaler object;
an edited or deleted ScaledObject comes back at the next resync; an operator that restarts
prunes the ScaledObject of a switch it did not see. KEDA's own controller is not run in this
module (nothing here needs it): e2e/test_keda_controller.py runs KEDA's real operator and
metrics API server (e2e/keda_controller.py) and scales a pool on these ScaledObjects.
"""

from __future__ import annotations

import copy
import json
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.kubectl import Kubectl, KubectlError
from e2e.operator_fixtures import OperatorProcess, glm_crds
from e2e.test_operator import CPU_MV, CPU_SVC, condition, deploy_model, glms

__all__ = ["glm_crds"]  # fixture used by name

SERVICE_LABEL = "glm-operator.dev/service"
MANAGED = "app.kubernetes.io/managed-by=glm-operator"
# Never queried here (KEDA's controller does not run); the operator only needs an address.
PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"
# Device memory above the A10 plan (about 51 %) and within the HPA's reach (90 % at most).
ALL_TARGETS = {"requestsPerSecond": 2.5, "queueLength": 4, "kvCacheUtilization": 80,
               "acceleratorMemoryUtilization": 90}
RESYNC_SECONDS = 3
Wait = Callable[..., Any]


@dataclass
class KedaOperator:
    """An operator of its own on a namespace no other operator watches, with a Prometheus
    address (so Auto can pick KEDA) and a short resync (so edits come back quickly)."""

    kubectl: Kubectl
    namespace: str
    config: Path
    process: OperatorProcess | None = None

    def start(self, wait_for: Wait) -> None:
        self.process = OperatorProcess(
            self.kubectl, namespaces=(self.namespace,),
            extra_args=("--config", str(self.config),
                        "--resync-seconds", str(RESYNC_SECONDS)))
        wait_for(self.process.alive, timeout=60, what="the KEDA tests' operator")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


@pytest.fixture(scope="module")
def keda(glm_crds: list[str], kubectl: Kubectl, wait_for: Wait) -> Iterator[KedaOperator]:
    namespace = f"keda-{uuid.uuid4().hex[:6]}"
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        yaml.safe_dump({"prometheus": {"url": PROMETHEUS_URL}}, handle)
    operator = KedaOperator(kubectl, namespace, Path(handle.name))
    try:
        operator.start(wait_for)
        wait_for(lambda: kubectl.exists("serviceaccount", "default", "-n", namespace),
                 timeout=30, what="the default ServiceAccount")
        deploy_model(kubectl, namespace, CPU_MV, wait_for)
        yield operator
    finally:
        if operator.process is not None and operator.process.proc.poll() is not None:
            print(operator.process.tail(200))
        operator.stop()
        operator.config.unlink(missing_ok=True)
        kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)


def apply_service(kubectl: Kubectl, namespace: str, name: str, scaler: str,
                  targets: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    svc = copy.deepcopy(CPU_SVC)
    svc["metadata"]["name"] = name
    svc["spec"].pop("replicas", None)
    svc["spec"].update(spec)
    svc["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 4, "scaler": scaler,
                                  "targets": targets or {"queueLength": 2}}
    kubectl.apply(svc, namespace=namespace)
    return svc


def scaler_objects(kubectl: Kubectl, namespace: str, name: str) -> list[tuple[str, str]]:
    """The operator's HPAs and ScaledObjects of one service, as (kind, name)."""
    selector = f"{SERVICE_LABEL}={name},{MANAGED}"
    return sorted((obj["kind"], obj["metadata"]["name"])
                  for kind in ("horizontalpodautoscalers", "scaledobjects.keda.sh")
                  for obj in kubectl.items(kind, "-n", namespace, "-l", selector))


def main_deployment(kubectl: Kubectl, namespace: str, name: str) -> str:
    items = kubectl.items("deployments", "-n", namespace, "-l", f"{SERVICE_LABEL}={name}")
    return str(items[0]["metadata"]["name"])


def wait_for_scaler(kubectl: Kubectl, namespace: str, name: str, kind: str,
                    wait_for: Wait) -> str:
    """Wait until the service's only scaler object is of `kind`; return its name."""
    def only() -> str | None:
        found = scaler_objects(kubectl, namespace, name)
        return found[0][1] if len(found) == 1 and found[0][0] == kind else None
    result: str = wait_for(only, timeout=60, what=f"{name}'s only scaler object to be a {kind}")
    return result


def test_operator_applied_scaled_object_passes_the_real_crd_schema(
        keda: KedaOperator, kubectl: Kubectl, wait_for: Wait) -> None:
    ns, name = keda.namespace, "keda-all"
    # On an A10 (a fake GPU node): a CPU replica has no device memory to target.
    apply_service(kubectl, ns, name, "Auto", ALL_TARGETS, engine={"llamacpp": {}},
                  accelerator={"profile": "nvidia-a10", "count": 1})
    so_name = wait_for_scaler(kubectl, ns, name, "ScaledObject", wait_for)
    scaled = kubectl.get_json("scaledobject.keda.sh", so_name, "-n", ns)
    assert scaled["spec"]["scaleTargetRef"]["name"] == main_deployment(kubectl, ns, name)
    triggers = scaled["spec"]["triggers"]
    assert sorted(t["name"] for t in triggers) == sorted(ALL_TARGETS)
    assert {t["type"] for t in triggers} == {"prometheus"}
    assert all(t["metadata"]["serverAddress"] == PROMETHEUS_URL for t in triggers)
    cond = wait_for(lambda: condition(glms(kubectl, ns, name), "Autoscaling"), timeout=30,
                    what="the Autoscaling condition")
    assert (cond["status"], cond["reason"]) == ("True", "KEDA"), cond

    # The schema the operator's apply passed is really enforced: the same object with a
    # number where KEDA's CRD wants a string is refused by the API server.
    broken = {k: scaled[k] for k in ("apiVersion", "kind")}
    broken["metadata"] = {"name": so_name, "namespace": ns}
    broken["spec"] = copy.deepcopy(scaled["spec"])
    broken["spec"]["triggers"][0]["metadata"]["threshold"] = 5
    with pytest.raises(KubectlError, match=r"metadata\.threshold: expected string"):
        kubectl.run("apply", "--server-side", "--dry-run=server", "--field-manager=glm-e2e",
                    "-f", "-", input=json.dumps(broken))


def test_switching_between_hpa_and_keda_leaves_exactly_one_scaler(
        keda: KedaOperator, kubectl: Kubectl, wait_for: Wait) -> None:
    ns, name = keda.namespace, "keda-switch"
    svc = apply_service(kubectl, ns, name, "HPA")
    hpa = wait_for_scaler(kubectl, ns, name, "HorizontalPodAutoscaler", wait_for)
    deployment = main_deployment(kubectl, ns, name)
    assert hpa == deployment
    # As an autoscaler would: the pool grows to 2; no switch may reset it.
    kubectl("scale", "deployment", deployment, "-n", ns, "--replicas=2")
    for scaler, kind in (("KEDA", "ScaledObject"), ("HPA", "HorizontalPodAutoscaler"),
                         ("Auto", "ScaledObject")):
        svc["spec"]["autoscaling"]["scaler"] = scaler
        kubectl.apply(svc, namespace=ns)
        assert wait_for_scaler(kubectl, ns, name, kind, wait_for) == deployment
        replicas = kubectl.get_json("deployment", deployment, "-n", ns)["spec"]["replicas"]
        assert replicas == 2, f"switching to {scaler} reset the pool to {replicas} replicas"
    assert condition(glms(kubectl, ns, name), "Autoscaling")["reason"] == "KEDA"


def test_an_edited_or_deleted_scaled_object_is_restored(
        keda: KedaOperator, kubectl: Kubectl, wait_for: Wait) -> None:
    ns, name = keda.namespace, "keda-edit"
    apply_service(kubectl, ns, name, "KEDA", {"queueLength": 2, "requestsPerSecond": 1.5})
    so_name = wait_for_scaler(kubectl, ns, name, "ScaledObject", wait_for)
    intended = kubectl.get_json("scaledobject.keda.sh", so_name, "-n", ns)["spec"]
    kubectl("patch", "scaledobject.keda.sh", so_name, "-n", ns, "--type=json", "-p", json.dumps([
        {"op": "replace", "path": "/spec/maxReplicaCount", "value": 40},
        {"op": "remove", "path": "/spec/triggers/1"},
    ]))

    def spec() -> dict[str, Any]:
        found: dict[str, Any] = kubectl.get_json("scaledobject.keda.sh", so_name, "-n", ns)["spec"]
        return found
    wait_for(lambda: spec() == intended, timeout=10 * RESYNC_SECONDS,
             what="the edited ScaledObject restored")
    kubectl("delete", "scaledobject.keda.sh", so_name, "-n", ns)
    wait_for(lambda: spec() == intended, timeout=10 * RESYNC_SECONDS,
             what="the deleted ScaledObject restored")


def test_a_restarted_operator_prunes_the_scaled_object_of_a_switch_it_missed(
        keda: KedaOperator, kubectl: Kubectl, wait_for: Wait) -> None:
    ns, name = keda.namespace, "keda-restart"
    svc = apply_service(kubectl, ns, name, "KEDA")
    so_name = wait_for_scaler(kubectl, ns, name, "ScaledObject", wait_for)
    keda.stop()
    svc["spec"]["autoscaling"]["scaler"] = "HPA"
    kubectl.apply(svc, namespace=ns)
    keda.start(wait_for)
    assert wait_for_scaler(kubectl, ns, name, "HorizontalPodAutoscaler", wait_for) == so_name
