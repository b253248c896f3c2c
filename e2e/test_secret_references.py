"""A GLMService that names a Secret which does not exist says so in its status (ResolvedRefs,
with the Secret, the namespace and the fix), and the condition clears once the Secret is
created, and returns when it is deleted: the operator follows Secret names through its
metadata-only watch, on the real API server. An open endpoint carries OpenAccess=True."""

from __future__ import annotations

import copy
import time

from e2e.kubectl import Kubectl
from e2e.operator_fixtures import OperatorProcess, glm_crds, operator
from e2e.test_operator import CPU_MV, CPU_SVC, Wait, condition, deploy_model, glms, wait_condition

__all__ = ["glm_crds", "operator"]  # fixtures used by name


def test_a_missing_key_secret_is_a_condition_until_it_exists(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    deploy_model(kubectl, namespace, CPU_MV, wait_for)
    keyed = copy.deepcopy(CPU_SVC)
    keyed["spec"]["gateway"] = {"apiKeysSecret": "chat-keys"}
    kubectl.apply(keyed, namespace=namespace)
    name = keyed["metadata"]["name"]

    missing = wait_condition(kubectl, namespace, name, "ResolvedRefs", "False", wait_for)
    assert missing["reason"] == "SecretNotFound"
    for part in ("Secret chat-keys", f"namespace {namespace}", "spec.gateway.apiKeysSecret",
                 f"kubectl create secret generic chat-keys -n {namespace}"):
        assert part in missing["message"], missing["message"]
    access = condition(glms(kubectl, namespace, name), "OpenAccess")
    assert access is not None and (access["status"], access["reason"]) == ("False", "APIKeys")
    events = kubectl.items("events", "-n", namespace,
                           "--field-selector", f"involvedObject.name={name},reason=SecretNotFound")
    assert events and events[0]["type"] == "Warning"

    created = time.monotonic()
    kubectl("create", "secret", "generic", "chat-keys", "-n", namespace,
            "--from-literal=key1=sk-test")
    found = wait_condition(kubectl, namespace, name, "ResolvedRefs", "True", wait_for,
                           timeout=30)
    print(f"[e2e] ResolvedRefs cleared {time.monotonic() - created:.1f}s after the Secret "
          "was created")
    assert found["reason"] == "SecretsFound" and "chat-keys" in found["message"]

    kubectl("delete", "secret", "chat-keys", "-n", namespace)
    again = wait_condition(kubectl, namespace, name, "ResolvedRefs", "False", wait_for,
                           timeout=30)
    assert again["reason"] == "SecretNotFound"


def test_an_open_endpoint_is_a_warning_condition(
        operator: OperatorProcess, kubectl: Kubectl, namespace: str, wait_for: Wait) -> None:
    deploy_model(kubectl, namespace, CPU_MV, wait_for)
    kubectl.apply(CPU_SVC, namespace=namespace)  # gateway.access: Open
    name = CPU_SVC["metadata"]["name"]
    open_ = wait_condition(kubectl, namespace, name, "OpenAccess", "True", wait_for)
    assert open_["reason"] == "AccessOpen" and "serves anyone" in open_["message"]
    refs = condition(glms(kubectl, namespace, name), "ResolvedRefs")
    assert refs is not None and (refs["status"], refs["reason"]) == ("True",
                                                                     "NoSecretReferences")
    # Without the explicit choice the API server refuses it, naming the fix.
    unchosen = copy.deepcopy(CPU_SVC)
    unchosen["metadata"]["name"] = "unchosen"
    del unchosen["spec"]["gateway"]
    refused = kubectl.apply(unchosen, namespace=namespace, check=False)
    assert refused.returncode != 0
    assert "apiKeysSecret is required" in refused.stderr and "access: Open" in refused.stderr
