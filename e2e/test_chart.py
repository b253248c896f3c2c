"""The helm chart on the local control plane: install, upgrade, uninstall with the real helm,
the CRD upgrade path, and the chart's RBAC at work.

The RBAC proof: a token of the chart's ServiceAccount (TokenRequest, `kubectl create token`)
in a kubeconfig of its own, and the real operator process run with it instead of the admin
kubeconfig. It takes the chart's Lease, fetches and serves the CPU example to Ready and rolls
it to a second version: the rules are enough. The same token is refused what the operator
does not need (a Secret's data, other namespaces, cluster-wide writes): the rules are not
too much.

The operator pods the chart creates sit on kwok nodes, which run no containers; the operator
under test is the process started here, with the chart's identity.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import toolchain
from e2e.conftest import in_ci
from e2e.kubectl import Kubectl, KubectlError
from e2e.operator_fixtures import REPO, glm_crds, report_fetched
from e2e.test_ha import OperatorReplica, lease_holder, make_namespace
from e2e.test_operator import CPU_MV, CPU_SVC, glms, wait_ready

__all__ = ["glm_crds"]  # fixture used by name

CHART = REPO / "charts" / "glm-operator"
Wait = Callable[..., Any]


class Helm:
    def __init__(self, binary: Path, kubeconfig: Path, home: Path) -> None:
        self.binary = binary
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig),
                    "HELM_CACHE_HOME": str(home / "cache"),
                    "HELM_CONFIG_HOME": str(home / "config"),
                    "HELM_DATA_HOME": str(home / "data")}

    def __call__(self, *args: str, values: Mapping[str, Any] | None = None,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        extra = ["--values", "-"] if values is not None else []
        result = subprocess.run(
            [str(self.binary), *args, *extra], input=yaml.safe_dump(dict(values or {})),
            capture_output=True, text=True, check=False, env=self.env, timeout=300)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n"
                                 f"{result.stderr}{result.stdout}")
        return result


@pytest.fixture(scope="session")
def helm(kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    if not toolchain.is_cached("helm"):
        message = "helm is not built: `.venv/bin/python -m e2e.toolchain build helm`"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return Helm(toolchain.bin_dir("helm") / "helm", kubeconfig, tmp_path_factory.mktemp("helm"))


@pytest.fixture
def release_namespace(kubectl: Kubectl) -> Iterator[str]:
    name = make_namespace(kubectl, "glmchart-sys")
    yield name
    kubectl.run("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def watched_namespace(kubectl: Kubectl) -> Iterator[str]:
    """Served by the operator under test only (the session operator watches e2e-*)."""
    name = make_namespace(kubectl, "glmchart")
    yield name
    kubectl.run("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def release_name() -> str:
    return f"glm{uuid.uuid4().hex[:6]}"


def uninstall(helm: Helm, release: str, namespace: str) -> None:
    helm("uninstall", release, "-n", namespace, "--wait", "--timeout", "120s", check=False)


# --- install, upgrade, uninstall ----------------------------------------------------------------


def test_install_upgrade_uninstall(helm: Helm, kubectl: Kubectl, glm_crds: list[str],
                                   release_namespace: str, wait_for: Wait) -> None:
    ns, release = release_namespace, release_name()
    fullname = f"{release}-glm-operator"
    # crds.enabled=false: the shared cluster's CRDs belong to the e2e session (glm_crds).
    values = {"crds": {"enabled": False}}
    try:
        installed = helm("install", release, str(CHART), "-n", ns, "--wait", "--timeout",
                         "180s", values=values)
        assert "Next: serve a model" in installed.stdout
        assert "kubectl apply --server-side -f crds/" in installed.stdout
        deployment = kubectl.get_json("deployment", fullname, "-n", ns)
        assert deployment["status"]["readyReplicas"] == 2
        pods = kubectl.items("pods", "-n", ns, "-l", f"app.kubernetes.io/instance={release}")
        assert len({p["spec"]["nodeName"] for p in pods}) == 2, "anti-affinity spreads them"
        for kind, name in (("serviceaccount", fullname), ("configmap", fullname),
                           ("service", f"{fullname}-metrics"), ("pdb", fullname),
                           ("role", f"{fullname}-leader-election")):
            assert kubectl.exists(kind, name, "-n", ns), (kind, name)
        assert kubectl.exists("clusterrole", fullname)
        template_before = deployment["spec"]["template"]["metadata"]["annotations"]

        url = "http://prometheus-operated.monitoring:9090"
        helm("upgrade", release, str(CHART), "-n", ns, "--reuse-values", "--wait",
             "--timeout", "180s", "--set", f"config.prometheus.url={url}", "--set",
             f"watchNamespaces={{{ns}}}")
        config = yaml.safe_load(kubectl.get_json("configmap", fullname, "-n", ns)
                                ["data"]["config.yaml"])
        assert config["prometheus"] == {"url": url}
        deployment = kubectl.get_json("deployment", fullname, "-n", ns)
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["checksum/config"] != template_before["checksum/config"]
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--namespace={ns}" in args and "--all-namespaces" not in args
        # namespaced now: the cluster-wide rules went, a Role in the watched namespace came
        rules = kubectl.get_json("clusterrole", fullname)["rules"]
        assert [r["resources"] for r in rules] == [["customresourcedefinitions"], ["namespaces"]]
        assert kubectl.exists("role", fullname, "-n", ns)
        history = json.loads(helm("history", release, "-n", ns, "-o", "json").stdout)
        assert [h["revision"] for h in history] == [1, 2]
    finally:
        uninstall(helm, release, ns)
    for kind, name in (("deployment", fullname), ("serviceaccount", fullname),
                       ("role", f"{fullname}-leader-election")):
        assert not kubectl.exists(kind, name, "-n", ns), (kind, name)
    assert not kubectl.exists("clusterrole", fullname)
    assert not kubectl.exists("clusterrolebinding", fullname)


def test_every_rendered_object_is_valid_for_the_api_server(
        helm: Helm, kubectl: Kubectl, release_namespace: str) -> None:
    """Server-side dry run of what the chart renders with every option the cluster has the
    CRDs for (the Prometheus Operator's ServiceMonitor; PrometheusRule is not installed)."""
    values = {"watchNamespaces": [release_namespace],
              "metrics": {"serviceMonitor": {"enabled": True}, "dashboard": {"enabled": True}},
              "config": {"prometheus": {"url": "http://prometheus-operated.monitoring:9090"}}}
    rendered = helm("template", "glm", str(CHART), "-n", release_namespace, "--kube-version",
                    toolchain.versions()["kubernetes"], values=values).stdout
    objects = [o for o in yaml.safe_load_all(rendered)
               if o and o["kind"] != "CustomResourceDefinition"]
    assert {"ServiceMonitor", "Deployment", "PodDisruptionBudget"} <= {o["kind"] for o in objects}
    result = kubectl.run(
        "apply", "--server-side", "--dry-run=server", "--field-manager=glm-chart-dry-run",
        "-n", release_namespace, "-f", "-", input=yaml.safe_dump_all(objects))
    assert result.stdout.count("(server dry run)") == len(objects), result.stdout


# --- the CRD upgrade path -------------------------------------------------------------------------


def _chart_with_renamed_crds(tmp: Path, group: str) -> Path:
    """A copy of the chart whose CRDs live in another API group: the path can be exercised
    for real without touching the CRDs every other test on the shared cluster uses."""
    chart = tmp / "glm-operator"
    shutil.copytree(CHART, chart)
    for path in (chart / "files" / "crds").glob("*.yaml"):
        path.write_text(path.read_text().replace("serving.glm-operator.dev", group))
    return chart


def _add_spec_field(chart: Path, plural: str, field: str) -> None:
    """The next chart version's CRD: one more optional spec field."""
    path = next((chart / "files" / "crds").glob(f"*_{plural}.yaml"))
    crd = yaml.safe_load(path.read_text())
    for version in crd["spec"]["versions"]:
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        spec["properties"][field] = {"type": "string", "description": "added by the upgrade"}
    path.write_text(yaml.safe_dump(crd, sort_keys=False))


def test_crds_upgrade_with_the_release_and_outlive_it(
        helm: Helm, kubectl: Kubectl, release_namespace: str, tmp_path: Path,
        wait_for: Wait) -> None:
    ns, release = release_namespace, release_name()
    group = f"serving.{release}.chart-e2e.dev"
    crd = f"modelversions.{group}"
    chart = _chart_with_renamed_crds(tmp_path, group)
    crd_files = sorted((chart / "files" / "crds").glob("*.yaml"))
    crd_names = [f"{yaml.safe_load(p.read_text())['spec']['names']['plural']}.{group}"
                 for p in crd_files]
    values = {"replicaCount": 1, "rbac": {"create": False},
              "metrics": {"service": {"enabled": False}}}
    mv = copy.deepcopy(CPU_MV)
    mv["apiVersion"] = f"{group}/v1alpha1"
    try:
        # Before: CRDs applied by hand (docs/install.md, crds.enabled=false).
        kubectl.apply_files(crd_files, field_manager="glm-install-docs")
        for name in crd_names:
            kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
        kubectl.apply(mv, namespace=ns)

        # Taking them over with crds.enabled=true: helm refuses objects it does not own ...
        refused = helm("install", release, str(chart), "-n", ns, values=values, check=False)
        assert refused.returncode != 0 and "invalid ownership metadata" in refused.stderr
        # ... until they carry the release's ownership metadata (docs/install.md).
        for name in crd_names:
            kubectl("label", "crd", name, "app.kubernetes.io/managed-by=Helm", "--overwrite")
            kubectl("annotate", "crd", name, f"meta.helm.sh/release-name={release}",
                    f"meta.helm.sh/release-namespace={ns}", "--overwrite")
        helm("install", release, str(chart), "-n", ns, values=values)
        live = kubectl.get_json("crd", crd)
        assert live["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"

        # The next chart version brings a new field: helm upgrade updates the CRD (helm
        # would never do this for crds/).
        probe = {"apiVersion": f"{group}/v1alpha1", "kind": "ModelVersion",
                 "metadata": {"name": mv["metadata"]["name"]},
                 "spec": {"upgradeProbe": "kept"}}
        # (another field manager than the ModelVersion's: its fields stay as they are)
        before = kubectl.apply(probe, namespace=ns, field_manager="glm-e2e-probe", check=False)
        assert before.returncode != 0 and "field not declared in schema" in before.stderr
        _add_spec_field(chart, "modelversions", "upgradeProbe")
        helm("upgrade", release, str(chart), "-n", ns, values=values)
        schema = kubectl.get_json("crd", crd)["spec"]["versions"][0]["schema"]
        assert "upgradeProbe" in schema["openAPIV3Schema"]["properties"]["spec"]["properties"]
        kubectl.apply(probe, namespace=ns, field_manager="glm-e2e-probe")
        kept = kubectl.get_json(f"modelversions.{group}", mv["metadata"]["name"], "-n", ns)
        assert kept["spec"]["upgradeProbe"] == "kept"

        # Uninstall keeps the CRDs, and with them every object of theirs.
        helm("uninstall", release, "-n", ns, "--wait")
        for name in crd_names:
            assert kubectl.exists("crd", name), f"{name} deleted with the release"
        assert kubectl.exists(f"modelversions.{group}", mv["metadata"]["name"], "-n", ns)
    finally:
        uninstall(helm, release, ns)
        for name in crd_names:
            kubectl.run("delete", "crd", name, "--wait=false", "--ignore-not-found",
                        check=False)


# --- the chart's RBAC at work --------------------------------------------------------------------


def service_account_kubeconfig(admin: Path, token: str, path: Path) -> Path:
    """A kubeconfig that authenticates with `token` only (no client certificate)."""
    config = yaml.safe_load(admin.read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
    ca = cluster["cluster"].get("certificate-authority")
    if ca and not Path(ca).is_absolute():
        cluster["cluster"]["certificate-authority"] = str(admin.parent / ca)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": "glm", "cluster": cluster["cluster"]}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "glm", "user": "sa"}}],
        "current-context": "sa",
    }))
    path.chmod(0o600)
    return path


def as_service_account(kubectl: Kubectl, namespace: str, account: str, path: Path) -> Kubectl:
    """kubectl with a fresh token of `account` (the TokenRequest API)."""
    token = kubectl("create", "token", account, "-n", namespace, "--duration=3600s")
    config = service_account_kubeconfig(kubectl.kubeconfig, token.stdout.strip(), path)
    return Kubectl(kubectl.binary, config)


def can_i(client: Kubectl, *args: str) -> bool:
    result = client.run("auth", "can-i", *args, check=False)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), result.stderr
    return answer == "yes"


def fetched_by_its_job(kubectl: Kubectl, namespace: str, mv: dict[str, Any], wait_for: Wait,
                       tmp: Path) -> str:
    """Apply a ModelVersion, wait for the operator's fetch Job, and report the fetch the way
    the Job does: with its own ServiceAccount, through the Role the operator granted it."""
    name = mv["metadata"]["name"]
    kubectl.apply(mv, namespace=namespace)
    job = wait_for(lambda: kubectl.items("jobs", "-n", namespace, "-l",
                                         f"glm-operator.dev/model-version={name}"),
                   timeout=90, what=f"the fetch Job of {name}")[0]
    account = job["spec"]["template"]["spec"]["serviceAccountName"]
    fetcher = as_service_account(kubectl, namespace, account, tmp / f"{account}.kubeconfig")
    assert can_i(fetcher, "patch", f"modelversions/{name}", "--subresource=status",
                 "-n", namespace)
    assert not can_i(fetcher, "patch", f"modelversions/{name}-other", "--subresource=status",
                     "-n", namespace), "the fetcher may write its own ModelVersion only"
    report_fetched(fetcher, namespace, name)
    return name


@pytest.mark.parametrize("mode", ["namespaced", "globbed"])
def test_the_operator_runs_on_the_charts_service_account_and_nothing_more(
        mode: str, helm: Helm, kubectl: Kubectl, glm_crds: list[str], release_namespace: str,
        watched_namespace: str, tmp_path: Path, wait_for: Wait) -> None:
    ns, watched, release = release_namespace, watched_namespace, release_name()
    fullname = f"{release}-glm-operator"
    # namespaced: exactly this namespace, Roles. globbed: a pattern, a ClusterRole.
    pattern = watched if mode == "namespaced" else f"{watched}*"
    helm("install", release, str(CHART), "-n", ns, "--wait", "--timeout", "180s",
         values={"crds": {"enabled": False}, "watchNamespaces": [pattern]})
    operator = None
    try:
        config = tmp_path / "config.yaml"
        config.write_text(kubectl.get_json("configmap", fullname, "-n", ns)["data"]
                          ["config.yaml"])
        identity = as_service_account(kubectl, ns, fullname, tmp_path / "operator.kubeconfig")
        operator = OperatorReplica(identity.kubeconfig, (pattern,), lease=fullname,
                                   lease_namespace=ns, identity="rbac-proof",
                                   extra=("--config", str(config)))
        wait_for(lambda: lease_holder(kubectl, ns, fullname) == "rbac-proof", timeout=60,
                 what="the operator holding the chart's Lease with the chart's token")

        # Enough: fetch, serve to Ready, roll to a second version.
        first = fetched_by_its_job(kubectl, watched, CPU_MV, wait_for, tmp_path)
        kubectl.apply(CPU_SVC, namespace=watched)
        service = CPU_SVC["metadata"]["name"]
        wait_ready(kubectl, watched, service, wait_for)
        assert kubectl.exists("role", "-n", watched, "-l",
                              f"glm-operator.dev/model-version={first}")
        second_mv = copy.deepcopy(CPU_MV)
        second_mv["metadata"]["name"] = f"{first}-v2"
        second = fetched_by_its_job(kubectl, watched, second_mv, wait_for, tmp_path)
        rolled = copy.deepcopy(CPU_SVC)
        rolled["spec"]["modelVersion"] = second
        kubectl.apply(rolled, namespace=watched)
        wait_for(lambda: glms(kubectl, watched, service).get("status", {}).get(
            "stableModelVersion") == second, timeout=180, what=f"the roll to {second}")
        wait_ready(kubectl, watched, service, wait_for)
        log = Path(operator.log.name).read_text()
        # (reconcile "errors" may count 409s: status writes guarded by resourceVersion)
        assert "forbidden" not in log.lower() and "API error: 403" not in log, \
            operator.tail(200)

        # Not more: what the operator never needs is refused to the same token.
        assert can_i(identity, "patch", "deployments", "-n", watched)
        assert can_i(identity, "get", f"leases/{fullname}", "-n", ns)
        # Secrets: names only (list/watch, asked as metadata), never get, write or delete.
        assert can_i(identity, "watch", "secrets", "-n", watched)
        refused = [
            ("get", "secrets", "-n", watched), ("create", "secrets", "-n", watched),
            ("patch", "secrets", "-n", watched), ("delete", "secrets", "-n", watched),
            ("get", "secrets", "-n", ns), ("create", "pods", "-n", watched),
            ("update", "deployments", "-n", watched), ("delete", "namespaces"),
            ("create", "clusterroles"), ("create", "clusterrolebindings"),
            ("bind", "clusterroles"), ("escalate", "roles", "-n", watched),
            ("patch", "customresourcedefinitions"), ("patch", "nodes"),
            ("create", "serviceaccounts", "--subresource=token", "-n", watched),
            ("impersonate", "serviceaccounts", "-n", watched),
        ]
        # The long-context pool's activity Lease is a child in every watched namespace (and
        # the operator must hold the patch it grants the gateways on it): a ClusterRole, as
        # for Deployments, when the namespaces are globbed.
        assert can_i(identity, "patch", "leases", "-n", watched)
        if mode == "namespaced":
            refused += [("get", "leases/kube-scheduler", "-n", "kube-system"),
                        ("patch", f"leases/{fullname}-other", "-n", ns),
                        ("list", "glmservices", "-n", "default"),
                        ("create", "deployments", "-n", "default"),
                        ("list", "deployments", "-A"), ("list", "secrets", "-A"),
                        ("patch", "glmservices", "-n", ns)]
        allowed = [" ".join(args) for args in refused if can_i(identity, *args)]
        assert allowed == []
        with pytest.raises(KubectlError, match="forbidden"):
            identity("get", "secret", "any-secret", "-n", watched)
    except BaseException:
        if operator is not None:
            print(f"--- operator ({mode}) ---\n{operator.tail(200)}")
        raise
    finally:
        if operator is not None:
            operator.stop()
        uninstall(helm, release, ns)
