"""The upgrade to GLMService v1alpha2 on the local control plane, with the real helm, the real
API server calling the operator's conversion webhook, and the previous release's operator.

    1. the previous release: its chart (the CRDs at v1alpha1 only) and its operator; a
       ModelVersion and a GLMService applied at v1alpha1, served to Ready, stored at v1alpha1;
    2. `helm upgrade` to this chart: the CRDs serve v1alpha1 and v1alpha2 and store v1alpha2,
       the API server converts through the webhook Service, with the CA helm generated;
       this operator (serving the webhook) takes over;
    3. the object reads at both versions (`kubectl get glms.v1alpha1...`, `.v1alpha2...`), each
       in its shape, the v1alpha2 one equal to api/conversion.py's answer; this operator
       reconciles it and writes no child (same uids, same generations, no pod replaced); a
       v1alpha1 manifest still applies, and a new service applied at v1alpha1 is served;
    4. `helm rollback` to the previous chart is refused by the API server (its CRD lacks
       v1alpha2, which status.storedVersions lists) and leaves everything serving; the
       supported way back (docs/install.md#rolling-back-to-v1alpha1): store v1alpha1 again,
       rewrite every object, drop v1alpha2 from storedVersions, then `helm rollback`; the
       previous operator serves the same children again.

Where the webhook runs: the chart's operator pods sit on kwok nodes, which run nothing (and
are kept Pending here, so that their fake addresses are no endpoints). The operator under
test is a local process on the chart's ServiceAccount, as in e2e/test_chart.py, serving the
webhook on an address the API server can be sent to: an EndpointSlice refuses loopback, so
it listens on this machine's end of a veth pair (e2e/netns.py), which the chart's webhook
Service's EndpointSlice names; the API server (--enable-aggregator-routing, which resolves
webhooks by endpoint too) dials it there and checks the certificate helm generated. (The
operator itself stays outside the namespace: its client, aiohttp under kopf, does not honour
a kubeconfig's tls-server-name, which reaching the API server from inside would need.)

This test replaces the cluster's GLM CRDs (an upgrade starts from the previous ones) and puts
back crds/ when it ends: run it on a cluster of its own (GLM_E2E_PORT_OFFSET=500) or where no
other test holds GLMServices. Needs root for the network namespace: in CI (CI=true) it FAILS
when it cannot have one; locally it is skipped with the reason.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.conftest import LocalCluster, in_ci
from e2e.kubectl import Kubectl, KubectlError
from e2e.netns import NetnsError, VethNamespace
from e2e.operator_fixtures import REPO, metric_sum, report_fetched
from e2e.ports import free_port
from e2e.test_chart import Helm, helm, release_name, service_account_kubeconfig
from e2e.test_ha import lease_holder, make_namespace

__all__ = ["helm"]  # fixture used by name

GROUP = "serving.glm-operator.dev"
V1, V2 = f"{GROUP}/v1alpha1", f"{GROUP}/v1alpha2"
CRDS = (f"glmservices.{GROUP}", f"modelversions.{GROUP}")
# The previous release: GLM_E2E_UPGRADE_FROM, else the parent of the commit that made the
# GLMService CRD serve v1alpha2 (found in git history).
UPGRADE_FROM_ENV = "GLM_E2E_UPGRADE_FROM"
FIELD_MANAGER = "glm-e2e-upgrade"
# Kinds of the children compared before and after (all the CPU example has).
CHILD_KINDS = ("deployments", "services", "serviceaccounts", "roles", "rolebindings",
               "configmaps", "poddisruptionbudgets", "horizontalpodautoscalers",
               "persistentvolumeclaims", "jobs")
Wait = Callable[..., Any]


def git(*args: str, binary: bool = False) -> Any:
    result = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=False,
                            timeout=60)
    if result.returncode != 0:
        raise AssertionError(f"git {' '.join(args)}: {result.stderr.decode().strip()}")
    return result.stdout if binary else result.stdout.decode().strip()


def previous_release() -> str:
    """The commit whose chart and operator are the previous release's."""
    if os.environ.get(UPGRADE_FROM_ENV):
        return str(git("rev-parse", os.environ[UPGRADE_FROM_ENV] + "^{commit}"))
    crd = f"crds/{GROUP}_glmservices.yaml"
    # First parents only: the commit on this line that brought v1alpha2 (a merge, when it
    # came from a branch), whose first parent is the release before it.
    first = git("log", "--first-parent", "--reverse", "--format=%H", "-S", "name: v1alpha2",
                "--", crd)
    if not first:
        pytest.skip("the GLMService CRD does not serve v1alpha2 yet: nothing to upgrade to")
    return str(git("rev-parse", first.splitlines()[0] + "^"))


def extract(ref: str, into: Path, *paths: str) -> Path:
    """`paths` of commit `ref`, as files under `into`."""
    archive = git("archive", "--format=tar", ref, *paths, binary=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


# --- the operators ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Webhook:
    address: str
    port: int
    cert: Path
    key: Path


class Operator:
    """`glm-operator run` on the chart's ServiceAccount: the previous release's (from its
    source tree, on this machine) or this one (in the network namespace, with the webhook)."""

    def __init__(self, name: str, kubeconfig: Path, watched: str, lease: str, lease_ns: str,
                 *, package: Path | None = None, webhook: Webhook | None = None,
                 config: Path | None = None) -> None:
        self.name = name
        self.host = "127.0.0.1"
        self.metrics_port, self.liveness_port = free_port(), free_port()
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (lives as long as the process)
            prefix=f"glm-operator-{name}-", suffix=".log", delete=False)
        argv = [sys.executable, "-m", "glm_operator.cli", "run", "--namespace", watched,
                "--kubeconfig", str(kubeconfig),
                "--liveness", f"http://{self.host}:{self.liveness_port}/healthz",
                "--metrics-port", str(self.metrics_port),
                "--leader-elect", "--leader-elect-lease", lease,
                "--leader-elect-namespace", lease_ns, "--leader-elect-identity", name,
                "--leader-elect-lease-duration", "6", "--leader-elect-renew-deadline", "4",
                "--leader-elect-retry-period", "1"]
        if config is not None:
            argv += ["--config", str(config)]
        if webhook is not None:
            argv += ["--webhook-port", str(webhook.port), "--webhook-bind", webhook.address,
                     "--webhook-cert-file", str(webhook.cert),
                     "--webhook-key-file", str(webhook.key)]
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"}
        env.pop("POD_NAME", None)
        env.pop("POD_NAMESPACE", None)
        if package is not None:
            env["PYTHONPATH"] = str(package)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     cwd=package.parent if package is not None else REPO)

    def metric(self, name: str, **labels: str) -> float:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n"
                                 f"{self.tail()}")
        url = f"http://{self.host}:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
        except urllib.error.URLError:
            return 0.0  # not listening yet
        return metric_sum(text, name, **labels)

    def tail(self, lines: int = 120) -> str:
        text = Path(self.log.name).read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# --- observing ----------------------------------------------------------------------------------


def children(kubectl: Kubectl, namespace: str) -> dict[str, dict[str, Any]]:
    """kind/name -> what identifies each object the operator made in `namespace`: uid,
    generation (moves with every spec write), labels, annotations and spec."""
    found = {}
    for kind in CHILD_KINDS:
        for obj in kubectl.items(kind, "-n", namespace, "-l",
                                 "app.kubernetes.io/managed-by=glm-operator"):
            meta = obj["metadata"]
            found[f"{obj['kind']}/{meta['name']}"] = {
                "uid": meta["uid"], "generation": meta.get("generation"),
                "labels": meta.get("labels", {}), "annotations": meta.get("annotations", {}),
                "spec": obj.get("spec"),
            }
    return found


def pods(kubectl: Kubectl, namespace: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"]
            for p in kubectl.items("pods", "-n", namespace)}


def read(kubectl: Kubectl, version: str, namespace: str, name: str,
         plural: str = "glmservices") -> dict[str, Any]:
    return kubectl.get_json(f"{plural}.{version}.{GROUP}", name, "-n", namespace)


def ready(obj: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in obj.get("status", {}).get("conditions", []))


def stored_versions(kubectl: Kubectl, crd: str) -> list[str]:
    return list(kubectl.get_json("crd", crd).get("status", {}).get("storedVersions", []))


def storage_version(kubectl: Kubectl, crd: str) -> str:
    return str(next(v["name"] for v in kubectl.get_json("crd", crd)["spec"]["versions"]
                    if v["storage"]))


# --- the cluster's CRDs -----------------------------------------------------------------------


def delete_glm_crds(kubectl: Kubectl) -> None:
    """Deleting a CRD deletes its objects, which the API server reads at the storage version:
    with a webhook nobody serves any more (a run cut short) that hangs, so the conversion is
    switched off first."""
    for crd in CRDS:
        if kubectl.exists("crd", crd):
            kubectl("patch", "crd", crd, "--type=merge", "-p",
                    json.dumps({"spec": {"conversion": {"strategy": "None", "webhook": None}}}))
        kubectl.run("delete", "crd", crd, "--ignore-not-found", "--wait=true", "--timeout=120s",
                    check=False, timeout=150)


def restore_glm_crds(kubectl: Kubectl) -> None:
    """crds/ as the e2e session applies it (operator_fixtures.glm_crds), for later tests."""
    delete_glm_crds(kubectl)
    files = sorted((REPO / "crds").glob("*.yaml"))
    kubectl.apply_files(files, field_manager="glm-e2e-crds")


# --- the test -----------------------------------------------------------------------------------


@pytest.fixture
def netns(cluster: LocalCluster) -> Iterator[VethNamespace]:
    try:
        if cluster.flavour != "kwok":
            raise NetnsError("the upgrade test runs on the local control plane only "
                             "(GLM_E2E_KIND is set)")
        namespace = VethNamespace.for_cluster(link="u").create()
    except NetnsError as exc:
        message = f"the webhook needs a network namespace: {exc}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield namespace
    finally:
        namespace.remove()


def test_upgrade_to_v1alpha2_and_back(helm: Helm, kubectl: Kubectl, netns: VethNamespace,
                                      tmp_path: Path, wait_for: Wait) -> None:
    from glm_operator.api import conversion  # type: ignore[attr-defined,unused-ignore]

    old_ref = previous_release()
    old = extract(old_ref, tmp_path / "previous", "charts/glm-operator", "operator/glm_operator",
                  "examples/cpu-llamacpp")
    old_chart, old_package = old / "charts" / "glm-operator", old / "operator"
    mv = yaml.safe_load((old / "examples/cpu-llamacpp/modelversion.yaml").read_text())
    svc = yaml.safe_load((old / "examples/cpu-llamacpp/glmservice.yaml").read_text())
    assert (mv["apiVersion"], svc["apiVersion"]) == (V1, V1)
    mv["spec"].setdefault("cache", {})["accessMode"] = "ReadWriteMany"  # as e2e/test_operator
    # A setting that moves: at v1alpha1 the engine is a name and its settings sit beside it,
    # at v1alpha2 they are under the engine's key.
    svc["spec"].update({"engine": "llamacpp", "kvUnified": True})
    name, model = svc["metadata"]["name"], mv["metadata"]["name"]

    release = release_name()
    fullname = f"{release}-glm-operator"
    system, watched = make_namespace(kubectl, "glmup-sys"), make_namespace(kubectl, "glmup")
    # The chart's operator pods stay Pending: kwok would make them Ready with fake addresses,
    # and the API server would dial those for the webhook.
    values = {"watchNamespaces": [watched], "nodeSelector": {"glm-e2e/no-such-node": "true"}}
    operators: list[Operator] = []
    try:
        delete_glm_crds(kubectl)

        # 1. The previous release, and a service stored at v1alpha1.
        helm("install", release, str(old_chart), "-n", system, values=values)
        assert [v["name"] for v in kubectl.get_json("crd", CRDS[0])["spec"]["versions"]] == [
            "v1alpha1"]
        identity = service_account_kubeconfig(
            kubectl.kubeconfig, kubectl("create", "token", fullname, "-n", system,
                                        "--duration=3600s").stdout.strip(),
            tmp_path / "operator.kubeconfig")
        config = tmp_path / "config.yaml"
        config.write_text(kubectl.get_json("configmap", fullname, "-n", system)
                          ["data"]["config.yaml"])
        previous = Operator("previous", identity, watched, fullname, system,
                            package=old_package, config=config)
        operators.append(previous)
        wait_for(lambda: lease_holder(kubectl, system, fullname) == "previous", timeout=90,
                 what="the previous operator holding the chart's Lease")
        kubectl.apply(mv, namespace=watched, field_manager=FIELD_MANAGER)
        wait_for(lambda: kubectl.items("jobs", "-n", watched, "-l",
                                       f"glm-operator.dev/model-version={model}"),
                 timeout=90, what="the fetch Job")
        report_fetched(kubectl, watched, model)
        kubectl.apply(svc, namespace=watched, field_manager=FIELD_MANAGER)
        wait_for(lambda: ready(read(kubectl, "v1alpha1", watched, name)), timeout=180,
                 what=f"{name} Ready under the previous operator")
        time.sleep(5)  # let the last status writes and pod updates settle
        stored_v1 = read(kubectl, "v1alpha1", watched, name)
        before_children, before_pods = children(kubectl, watched), pods(kubectl, watched)
        assert any(k.startswith("Deployment/") for k in before_children), before_children
        assert before_pods, "the model pods run (on kwok)"
        previous.stop()

        # 2. The upgrade: both versions served, v1alpha2 stored, the webhook in front.
        helm("upgrade", release, str(REPO / "charts" / "glm-operator"), "-n", system,
             values=values)
        crd = kubectl.get_json("crd", CRDS[0])
        assert [(v["name"], v["served"], v["storage"]) for v in crd["spec"]["versions"]] == [
            ("v1alpha1", True, False), ("v1alpha2", True, True)]
        client = crd["spec"]["conversion"]["webhook"]["clientConfig"]
        secret = kubectl.get_json("secret", f"{fullname}-webhook-tls", "-n", system)
        assert client["service"]["name"] == f"{fullname}-webhook"
        assert client["service"]["namespace"] == system
        assert base64.b64decode(client["caBundle"]) == base64.b64decode(secret["data"]["ca.crt"])
        cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
        cert.write_bytes(base64.b64decode(secret["data"]["tls.crt"]))
        key.write_bytes(base64.b64decode(secret["data"]["tls.key"]))
        key.chmod(0o600)
        webhook = Webhook(netns.host_ip, free_port(), cert, key)
        kubectl.apply({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{fullname}-webhook-e2e", "namespace": system, "labels": {
                "kubernetes.io/service-name": f"{fullname}-webhook",
                "endpointslice.kubernetes.io/managed-by": FIELD_MANAGER}},
            "addressType": "IPv4",
            "ports": [{"name": "webhook", "port": webhook.port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [webhook.address], "conditions": {"ready": True}}],
        }, field_manager=FIELD_MANAGER)
        config.write_text(kubectl.get_json("configmap", fullname, "-n", system)
                          ["data"]["config.yaml"])
        current = Operator("current", identity, watched, fullname, system, webhook=webhook,
                           config=config)
        operators.append(current)

        # 3. Both versions read it; the v1alpha2 one is the conversion's answer.
        as_v2 = wait_for(lambda: _read_or_none(kubectl, "v1alpha2", watched, name), timeout=60,
                         what=f"{name} read at v1alpha2 through the webhook")
        as_v1 = read(kubectl, "v1alpha1", watched, name)
        assert as_v1["spec"] == stored_v1["spec"]
        assert as_v2["apiVersion"] == V2 and as_v1["apiVersion"] == V1
        assert as_v2["metadata"]["uid"] == stored_v1["metadata"]["uid"]
        # The API server defaults and prunes by the v1alpha2 schema after converting: compare
        # through the v1alpha2 model, which does the same.
        expected = conversion.convert(copy.deepcopy(stored_v1), V2)
        assert v2_spec(as_v2) == v2_spec(expected)
        assert (as_v1["spec"]["engine"], as_v1["spec"]["kvUnified"]) == ("llamacpp", True)
        assert as_v2["spec"]["engine"] == {"llamacpp": {"kvUnified": True}}
        assert "kvUnified" not in as_v2["spec"]
        listed = kubectl.items(f"glmservices.v1alpha2.{GROUP}", "-n", watched)
        assert [o["metadata"]["name"] for o in listed] == [name]
        assert read(kubectl, "v1alpha2", watched, model, "modelversions")["spec"] == (
            read(kubectl, "v1alpha1", watched, model, "modelversions")["spec"])

        # ... this operator reconciles it and writes no child: same objects, same pods.
        wait_for(lambda: lease_holder(kubectl, system, fullname) == "current", timeout=60,
                 what="this operator holding the Lease")
        wait_for(lambda: current.metric("glm_operator_reconciles_total", kind="GLMService",
                                        result="ok") >= 1, timeout=90,
                 what=f"this operator's first reconcile of {name}")
        wait_for(lambda: ready(read(kubectl, "v1alpha2", watched, name)), timeout=60,
                 what=f"{name} Ready under this operator")
        # Checked at the end, so that one finding here does not hide the phases after it.
        unchanged = [*differences("after the upgrade", before_children,
                                  children(kubectl, watched)),
                     *differences("pods after the upgrade", before_pods, pods(kubectl, watched))]
        writes = current.metric("glm_operator_child_writes_total")
        if writes:
            unchanged.append(f"this operator wrote {writes:g} children: "
                             + "; ".join(line.strip() for line in current.tail(400).splitlines()
                                         if line.strip().startswith("applying ")))
        # The webhook was called for real (objects stored at v1alpha1 read at v1alpha2).
        assert current.metric("glm_operator_conversion_reviews_total", result="Success") >= 1

        # ... a v1alpha1 manifest still applies (Argo CD, kubectl), unchanged, and a new
        # service written at v1alpha1 is served.
        kubectl.apply(svc, namespace=watched, field_manager=FIELD_MANAGER)
        second = copy.deepcopy(svc)
        second["metadata"]["name"] = f"{name}-v1"
        kubectl.apply(second, namespace=watched, field_manager=FIELD_MANAGER)
        wait_for(lambda: ready(read(kubectl, "v1alpha1", watched, second["metadata"]["name"])),
                 timeout=180, what="a service applied at v1alpha1 after the upgrade, Ready")
        assert stored_versions(kubectl, CRDS[0]) == ["v1alpha1", "v1alpha2"]
        time.sleep(3)
        assert pods(kubectl, watched).items() >= before_pods.items()

        # 4. Rolling the chart back while objects are stored at v1alpha2: refused.
        refused = helm("rollback", release, "1", "-n", system, check=False)
        assert refused.returncode != 0
        assert "storedVersions" in refused.stderr and "v1alpha2" in refused.stderr, (
            refused.stderr)
        assert storage_version(kubectl, CRDS[0]) == "v1alpha2"
        # Stored at v1alpha2 by now: read at v1alpha1 it is the round trip, which must give
        # back what was stored.
        unchanged += differences("the v1alpha1 spec after v1alpha2 storage", stored_v1["spec"],
                                 read(kubectl, "v1alpha1", watched, name)["spec"])
        assert ready(read(kubectl, "v1alpha2", watched, name))

        # The supported way back (docs/install.md): store v1alpha1 again with the webhook
        # still up, rewrite every object, forget v1alpha2, then roll back.
        migrate_storage_to_v1alpha1(kubectl)
        assert stored_versions(kubectl, CRDS[0]) == ["v1alpha1"]
        current.stop()
        helm("rollback", release, "1", "-n", system)
        assert [v["name"] for v in kubectl.get_json("crd", CRDS[0])["spec"]["versions"]] == [
            "v1alpha1"]
        # (helm leaves spec.conversion as the refused rollback found it: its patch goes from
        # the failed revision, which had none, to the first, which has none. With one version
        # the API server never calls it.)
        back = Operator("previous-again", identity, watched, fullname, system,
                        package=old_package, config=config)
        operators.append(back)
        wait_for(lambda: back.metric("glm_operator_reconciles_total", kind="GLMService",
                                     result="ok") >= 2, timeout=120,
                 what="the previous operator reconciling both services again")
        unchanged += differences("the v1alpha1 spec after the rollback", stored_v1["spec"],
                                 read(kubectl, "v1alpha1", watched, name)["spec"])
        after = children(kubectl, watched)
        unchanged += differences("after the rollback", before_children,
                                 {k: v for k, v in after.items() if k in before_children})
        unchanged += differences("pods after the rollback", before_pods,
                                 {k: v for k, v in pods(kubectl, watched).items()
                                  if k in before_pods})
        # The second service was created under this operator: the previous one may write its
        # children (their owner references name v1alpha2, which it compares as written; an
        # optional child this operator had not made yet, with the cluster's CRDs of other
        # tests). Metadata and missing children only, no pod restarts: checked above. Any
        # write for the service stored before the upgrade is a finding.
        second_owned = f" {watched}/{second['metadata']['name']}"
        rewrites = [line.strip() for line in back.tail(400).splitlines()
                    if line.strip().startswith("applying ")]
        others = [line for line in rewrites if second_owned not in line]
        if others:
            unchanged.append("the previous operator, back, wrote children: " + "; ".join(others))
        assert unchanged == [], "\n".join(unchanged)
    except BaseException:
        for operator in operators:
            print(f"--- operator {operator.name} ---\n{operator.tail()}")
        raise
    finally:
        # The services first, while a webhook may still convert them (deleting an object
        # stored at another version than the one it is read at needs it).
        kubectl.run("delete", "glmservices,modelversions", "--all", "-n", watched,
                    "--wait=true", "--timeout=60s", check=False, timeout=90)
        for operator in operators:
            operator.stop()
        helm("uninstall", release, "-n", system, "--wait", "--timeout", "120s", check=False)
        for namespace in (watched, system):
            kubectl.run("delete", "namespace", namespace, "--wait=false", "--ignore-not-found",
                        check=False)
        restore_glm_crds(kubectl)


def differences(when: str, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What changed between two observations, one line per object."""
    found = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if old is None or new is None:
            found.append(f"{when}: {key} {'appeared' if old is None else 'went'}")
        elif isinstance(old, dict) and isinstance(new, dict):
            fields = sorted(f for f in set(old) | set(new) if old.get(f) != new.get(f))
            found.append(f"{when}: {key} changed {', '.join(fields)}")
        else:
            found.append(f"{when}: {key} replaced ({old} -> {new})")
    return found


def v2_spec(obj: dict[str, Any]) -> dict[str, Any]:
    from glm_operator.api.glmservice import GLMServiceSpec

    spec: dict[str, Any] = GLMServiceSpec.model_validate(obj["spec"]).model_dump(
        by_alias=True, exclude_none=True, mode="json")
    return spec


def _read_or_none(kubectl: Kubectl, version: str, namespace: str,
                  name: str) -> dict[str, Any] | None:
    with contextlib.suppress(KubectlError):
        return read(kubectl, version, namespace, name)
    return None


def migrate_storage_to_v1alpha1(kubectl: Kubectl) -> None:
    """docs/install.md#rolling-back-to-v1alpha1, step by step, for both CRDs."""
    for crd in CRDS:
        definition = kubectl.get_json("crd", crd)
        versions = definition["spec"]["versions"]
        patch = [{"op": "replace", "path": f"/spec/versions/{i}/storage",
                  "value": v["name"] == "v1alpha1"} for i, v in enumerate(versions)]
        kubectl("patch", "crd", crd, "--type=json", "-p", json.dumps(patch))
        plural = definition["spec"]["names"]["plural"]
        # Every object written again, so stored at v1alpha1: a change of its own (a write
        # that changes nothing may be skipped).
        kubectl("annotate", f"{plural}.v1alpha1.{GROUP}", "--all", "-A", "--overwrite",
                "glm-operator.dev/storage-migrated=v1alpha1")
        kubectl("patch", "crd", crd, "--subresource=status", "--type=merge", "-p",
                json.dumps({"status": {"storedVersions": ["v1alpha1"]}}))
