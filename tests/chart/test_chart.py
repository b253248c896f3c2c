"""The helm chart, rendered by the real helm and asserted object by object.

RBAC is pinned rule by rule: a change of the operator's permissions shows up here as a diff
to review, never silently. The installed chart and its RBAC at work are e2e/test_chart.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

import pytest
import yaml
from chart_helm import CHART, KUBE_VERSION, REPO, Helm, HelmError  # tests/chart is on sys.path
from glm_operator import __version__
from glm_operator.config import OperatorConfig
from glm_operator.controllers import indexes
from glm_operator.controllers.cli import add_arguments
from glm_operator.wellknown import GROUP
from pydantic import BaseModel

Obj = dict[str, Any]
Render = Callable[..., list[Obj]]

# --- the RBAC, literally -------------------------------------------------------------------------

# In every watched namespace: a Role there, or part of the ClusterRole when cluster-wide.
NAMESPACED_RULES: list[Obj] = [
    {"apiGroups": ["serving.glm-operator.dev"], "resources": ["glmservices"],
     "verbs": ["list", "watch", "patch"]},
    {"apiGroups": ["serving.glm-operator.dev"], "resources": ["glmservices/status"],
     "verbs": ["patch"]},
    {"apiGroups": ["serving.glm-operator.dev"], "resources": ["modelversions"],
     "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["serving.glm-operator.dev"], "resources": ["modelversions/status"],
     "verbs": ["get", "patch", "update"]},
    {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets"],
     "verbs": ["list", "watch", "create", "patch", "delete"]},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]},  # the router's
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
     "verbs": ["list", "watch", "create", "patch", "delete"]},
    {"apiGroups": ["apps"], "resources": ["deployments/scale"],
     "verbs": ["get", "patch", "update"]},
    {"apiGroups": [""], "resources": ["services", "serviceaccounts", "persistentvolumeclaims"],
     "verbs": ["list", "watch", "create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["configmaps"],
     "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    # handed to the endpoint picker's and the router's Roles only
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"],
     "verbs": ["list", "watch", "create", "patch", "delete"]},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"],
     "verbs": ["list", "watch", "create", "patch", "delete"]},
    {"apiGroups": ["batch"], "resources": ["jobs"],
     "verbs": ["list", "watch", "create", "patch", "delete"]},
    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"],
     "verbs": ["list", "watch", "create", "patch", "delete"]},
    {"apiGroups": ["monitoring.coreos.com"], "resources": ["servicemonitors"],
     "verbs": ["get", "list", "create", "patch", "delete"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
     "verbs": ["get", "list", "create", "update", "patch", "delete"]},
    {"apiGroups": ["leaderworkerset.x-k8s.io"], "resources": ["leaderworkersets"],
     "verbs": ["get", "list", "create", "patch", "delete"]},
    {"apiGroups": ["networking.istio.io"], "resources": ["virtualservices", "destinationrules"],
     "verbs": ["get", "list", "create", "patch", "delete"]},
    {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"],
     "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["httproutes"],
     "verbs": ["get", "list", "create", "patch", "delete"]},
    # handed to the pools' endpoint pickers only
    {"apiGroups": ["inference.networking.x-k8s.io"],
     "resources": ["inferenceobjectives", "inferencemodelrewrites"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["keda.sh"], "resources": ["scaledobjects"],
     "verbs": ["get", "list", "create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    # names only (PartialObjectMetadata, controllers/secrets.py); rbac.watchSecrets: false drops it
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list", "watch"]},
]
CRD_RULES: list[Obj] = [
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
     "verbs": ["get", "list", "watch"]},
]
NAMESPACE_LISTING_RULES: list[Obj] = [
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
]


def lease_rules(lease: str) -> list[Obj]:
    return [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [lease],
         "verbs": ["get", "patch"]},
    ]


# --- helpers -------------------------------------------------------------------------------------


def find(objs: list[Obj], kind: str, name: str | None = None,
         namespace: str | None = None) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind
            and (name is None or o["metadata"]["name"] == name)
            and (namespace is None or o["metadata"].get("namespace") == namespace)]


def one(objs: list[Obj], kind: str, name: str | None = None,
        namespace: str | None = None) -> Obj:
    found = find(objs, kind, name, namespace)
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}: " + \
        ", ".join(o["metadata"]["name"] for o in find(objs, kind))
    return found[0]


def kinds(objs: list[Obj]) -> list[tuple[str, str]]:
    return sorted((o["kind"], o["metadata"]["name"]) for o in objs)


def container(objs: list[Obj]) -> Obj:
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["operator"]
    result: Obj = pod["containers"][0]
    return result


def permissions(rules: Iterable[Obj]) -> set[tuple[str, str, str, str]]:
    """(apiGroup, resource, verb, resourceName or '') for every combination a rule allows."""
    out = set()
    for rule in rules:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or [""]:
                        out.add((group, resource, verb, name))
    return out


def allows(rules: Iterable[Obj], group: str, resource: str, verb: str, name: str = "") -> bool:
    held = permissions(rules)
    return (group, resource, verb, "") in held or (name != "" and
                                                    (group, resource, verb, name) in held)


def helm_fails(helm: Helm, values: dict[str, Any], *args: str) -> str:
    with pytest.raises(HelmError) as failure:
        helm.run("template", "glm", str(CHART), "--kube-version", KUBE_VERSION,
                 "--values", "-", *args, input=yaml.safe_dump(values))
    return failure.value.stderr


# --- lint and the default render -----------------------------------------------------------------


@pytest.mark.parametrize("values", [
    {},
    {"watchNamespaces": ["team-a", "team-b"]},
    {"watchNamespaces": ["team-*"], "replicaCount": 3, "podAntiAffinity": "hard"},
    {"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                 "dashboard": {"enabled": True}, "prometheusAdapterRules": {"enabled": True}},
     "config": {"prometheus": {"url": "http://prometheus-operated.monitoring:9090"}}},
    {"replicaCount": 1, "leaderElection": {"enabled": False}, "crds": {"enabled": False}},
], ids=["defaults", "namespaced", "globbed", "monitoring", "single"])
def test_helm_lint_strict(helm: Helm, values: dict[str, Any]) -> None:
    result = helm.run("lint", "--strict", str(CHART), "--values", "-",
                      input=yaml.safe_dump(values))
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout, result.stdout


def test_default_render_has_the_operator_and_nothing_optional(render: Render) -> None:
    objs = render()
    assert kinds(objs) == [
        ("ClusterRole", "glm-glm-operator"),
        ("ClusterRoleBinding", "glm-glm-operator"),
        ("ConfigMap", "glm-glm-operator"),
        ("CustomResourceDefinition", "glmservices.serving.glm-operator.dev"),
        ("CustomResourceDefinition", "modelversions.serving.glm-operator.dev"),
        ("Deployment", "glm-glm-operator"),
        ("PodDisruptionBudget", "glm-glm-operator"),
        ("Role", "glm-glm-operator-leader-election"),
        ("RoleBinding", "glm-glm-operator-leader-election"),
        ("Secret", "glm-glm-operator-webhook-tls"),
        ("Service", "glm-glm-operator-metrics"),
        ("Service", "glm-glm-operator-webhook"),
        ("ServiceAccount", "glm-glm-operator"),
    ]
    for obj in objs:
        if obj["kind"] != "CustomResourceDefinition" and not obj["kind"].startswith("Cluster"):
            assert obj["metadata"]["namespace"] == "glm-system", obj["metadata"]


def test_image_is_the_packages_version_and_the_same_the_operator_runs_its_pods_from(
        render: Render) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    image = container(render())["image"]
    assert image == f"ghcr.io/glm-operator/glm-operator:{__version__}"
    assert image == OperatorConfig().operator_image
    custom = container(render({"image": {"registry": "registry.example/ml/", "tag": "0.2.0"}}))
    assert custom["image"] == "registry.example/ml/glm-operator:0.2.0"


# --- RBAC ----------------------------------------------------------------------------------------


def test_cluster_wide_rbac_is_pinned(render: Render) -> None:
    objs = render()
    assert one(objs, "ClusterRole")["rules"] == CRD_RULES + NAMESPACED_RULES
    binding = one(objs, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": "glm-glm-operator"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "glm-glm-operator",
                                    "namespace": "glm-system"}]
    lease = one(objs, "Role", "glm-glm-operator-leader-election", "glm-system")
    assert lease["rules"] == lease_rules("glm-glm-operator")
    assert one(objs, "RoleBinding")["roleRef"]["name"] == "glm-glm-operator-leader-election"
    assert "--all-namespaces" in container(objs)["args"]


def test_namespaced_mode_gives_roles_and_cluster_wide_only_reads_of_crds_and_namespaces(
        render: Render) -> None:
    objs = render({"watchNamespaces": ["team-a", "team-b"]})
    # kopf lists namespaces whenever it is given some (refused: a minute of retries first)
    assert one(objs, "ClusterRole")["rules"] == CRD_RULES + NAMESPACE_LISTING_RULES
    for namespace in ("team-a", "team-b"):
        role = one(objs, "Role", "glm-glm-operator", namespace)
        assert role["rules"] == NAMESPACED_RULES
        binding = one(objs, "RoleBinding", "glm-glm-operator", namespace)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": "glm-glm-operator"}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "glm-glm-operator",
                                        "namespace": "glm-system"}]
    assert {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in find(objs, "Role")} == {
        ("team-a", "glm-glm-operator"), ("team-b", "glm-glm-operator"),
        ("glm-system", "glm-glm-operator-leader-election")}
    args = container(objs)["args"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace=")] == [
        "--namespace=team-a", "--namespace=team-b"]


def test_namespace_globs_need_a_cluster_role(render: Render) -> None:
    objs = render({"watchNamespaces": ["team-*", "ml"]})
    # Globs watch cluster-wide and filter in the operator: no listing of namespaces needed.
    assert one(objs, "ClusterRole")["rules"] == CRD_RULES + NAMESPACED_RULES
    assert find(objs, "Role") == [one(objs, "Role", "glm-glm-operator-leader-election")]
    assert [a for a in container(objs)["args"] if a.startswith("--namespace=")] == [
        "--namespace=team-*", "--namespace=ml"]


@pytest.mark.parametrize("values", [
    {}, {"watchNamespaces": ["a"]}, {"watchNamespaces": ["a-*"]},
    {"leaderElection": {"enabled": False}, "replicaCount": 1},
])
def test_no_wildcards_and_no_secret_reads_beyond_names_in_rbac(
        render: Render, values: dict[str, Any]) -> None:
    for obj in render(values):
        if obj["kind"] not in ("Role", "ClusterRole"):
            continue
        for rule in obj["rules"]:
            for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert not any("*" in item for item in rule.get(key, [])), (obj, rule)
            if "secrets" in rule["resources"]:
                assert rule == {"apiGroups": [""], "resources": ["secrets"],
                                "verbs": ["list", "watch"]}, rule
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


def test_secret_names_can_be_left_unwatched(render: Render) -> None:
    for obj in render({"rbac": {"watchSecrets": False}}):
        if obj["kind"] in ("Role", "ClusterRole"):
            assert not [r for r in obj["rules"] if "secrets" in r["resources"]], obj


def test_without_leader_election_there_is_no_lease_role(render: Render) -> None:
    objs = render({"leaderElection": {"enabled": False}, "replicaCount": 1})
    assert not find(objs, "Role")
    assert not any(a.startswith("--leader-elect") for a in container(objs)["args"])


def test_rbac_create_false_renders_no_rbac(render: Render) -> None:
    objs = render({"rbac": {"create": False}})
    assert not [o for o in objs if o["kind"] in
                ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")]


def test_every_kind_the_operator_watches_is_listed_and_watched() -> None:
    """kopf indexes every child kind (controllers/indexes.py): list and watch each."""
    watched = [(group, plural) for group, _, plural in
               (*indexes.SERVICE_CRD_CHILDREN, *indexes.MODEL_VERSION_CHILDREN)]
    watched += [(GROUP, "glmservices"), (GROUP, "modelversions")]
    for group, plural in watched:
        for verb in ("list", "watch"):
            assert allows(NAMESPACED_RULES, group, plural, verb), (group, plural, verb)
    for group, _, plural in (*indexes.SERVICE_CRD_CHILDREN, *indexes.MODEL_VERSION_CHILDREN):
        for verb in ("create", "patch", "delete"):  # kube/client.py apply, create, delete
            assert allows(NAMESPACED_RULES, group, plural, verb), (group, plural, verb)


def _rendered_roles() -> list[Obj]:
    """Every Role the operator renders for the examples (offline, `glm-operator render`)."""
    import contextlib
    import io

    from glm_operator.cli import main

    roles: list[Obj] = []
    for example in sorted(p.parent for p in (REPO / "examples").glob("*/glmservice.yaml")):
        if not (example / "modelversion.yaml").exists():
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["render", "-f", str(example / "glmservice.yaml"),
                         "-f", str(example / "modelversion.yaml")]) == 0
        roles += [d for d in yaml.safe_load_all(out.getvalue()) if d and d["kind"] == "Role"]
    return roles


def test_the_operator_holds_everything_it_grants_in_the_roles_it_renders() -> None:
    """Kubernetes refuses a Role (or a binding to it) holding rights its creator lacks."""
    from glm_operator.render.endpoint_picker import pool_epp_rules
    from glm_operator.render.rbac import (
        activity_lease_rules,
        model_version_status_rules,
        scale_rules,
    )
    from glm_operator.render.routing import (
        LongContextRoute,
        RouteEntry,
        epp_rules,
        router_rules,
    )

    roles = _rendered_roles()
    granted = [rule for role in roles for rule in role["rules"]]
    granted += (scale_rules("any") + model_version_status_rules(GROUP, "any")
                + activity_lease_rules("any") + epp_rules() + pool_epp_rules("any")
                + router_rules([RouteEntry("v", 100, "any", 0, 300.0, "any", "any-lc")],
                               "any", LongContextRoute("http://x", 1, 0, 300.0, "any")))
    assert {r for rule in granted for r in rule["resources"]} == {
        "modelversions", "modelversions/status", "deployments/scale", "leases", "pods",
        "configmaps", "deployments", "inferencepools", "inferenceobjectives",
        "inferencemodelrewrites",
    }, "a new Role: pin it"
    for group, resource, verb, name in permissions(granted):
        assert allows(NAMESPACED_RULES, group, resource, verb, name), (group, resource, verb)


# --- the pod -------------------------------------------------------------------------------------


def test_secure_pod_defaults(render: Render) -> None:
    objs = render()
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532,
                                      "runAsGroup": 65532,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    ctr = container(objs)
    assert ctr["securityContext"] == {"allowPrivilegeEscalation": False,
                                      "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                                      "capabilities": {"drop": ["ALL"]}}
    assert ctr["resources"] == {}
    assert ctr["imagePullPolicy"] == "IfNotPresent"
    assert {m["mountPath"] for m in ctr["volumeMounts"]} == {
        "/etc/glm-operator", "/etc/glm-operator-webhook", "/tmp"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID")
    assert ctr["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {p["name"]: p["containerPort"] for p in ctr["ports"]} == {"health": 8081,
                                                                     "metrics": 8082,
                                                                     "webhook": 9443}


def test_args_are_accepted_by_the_operators_own_parser(render: Render) -> None:
    import argparse

    for values in ({}, {"watchNamespaces": ["a", "b"], "verbose": True, "logFormat": "plain"}):
        args = container(render(values))["args"]
        assert args[0] == "run"
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        parsed = parser.parse_args(args[1:])
        assert str(parsed.config) == "/etc/glm-operator/config.yaml"
        assert parsed.metrics_port == 8082
        assert parsed.liveness == "http://0.0.0.0:8081/healthz"
        assert parsed.leader_elect
        assert parsed.leader_elect_lease == "glm-glm-operator"
        assert parsed.leader_elect_namespace == "$(POD_NAMESPACE)"  # expanded by the kubelet
        assert parsed.leader_elect_identity == "$(POD_NAME)"
        assert (parsed.leader_elect_lease_duration, parsed.leader_elect_renew_deadline,
                parsed.leader_elect_retry_period) == (15, 10, 2)
        assert parsed.log_format == values.get("logFormat", "json")
        assert parsed.all_namespaces == (not values)
        assert parsed.namespace == values.get("watchNamespaces", [])
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
           for e in container(render())["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}


def test_high_availability_defaults(render: Render) -> None:
    objs = render()
    deployment = one(objs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1,
                                                               "maxUnavailable": 0}
    selector = deployment["spec"]["selector"]["matchLabels"]
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == selector
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": selector}}

    hard = one(render({"podAntiAffinity": "hard"}), "Deployment")["spec"]["template"]["spec"]
    assert hard["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    custom = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "pool", "operator": "In", "values": ["system"]}]}]}}}
    spec = one(render({"affinity": custom}), "Deployment")["spec"]["template"]["spec"]
    assert spec["affinity"] == custom
    single = render({"replicaCount": 1})
    assert not find(single, "PodDisruptionBudget")  # it would block every drain


def test_several_replicas_without_leader_election_are_refused(helm: Helm) -> None:
    message = helm_fails(helm, {"replicaCount": 2, "leaderElection": {"enabled": False}})
    assert "replicaCount > 1 needs leaderElection.enabled" in message
    message = helm_fails(helm, {"leaderElection": {"renewDeadlineSeconds": 15}})
    assert "retryPeriodSeconds < renewDeadlineSeconds < leaseDurationSeconds" in message


# --- names ---------------------------------------------------------------------------------------


def _names_and_labels(objs: list[Obj]) -> Iterable[tuple[str, str]]:
    for obj in objs:
        meta = obj["metadata"]
        if obj["kind"] != "CustomResourceDefinition":
            yield "name", meta["name"]
        for key, value in meta.get("labels", {}).items():
            yield f"label {key}", value
        template = obj.get("spec", {}).get("template", {}).get("metadata", {})
        for key, value in template.get("labels", {}).items():
            yield f"pod label {key}", value


DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@pytest.mark.parametrize("values,release", [
    ({}, "r" * 53),  # helm's longest release name
    ({"fullnameOverride": "operator-" + "x" * 90}, "glm"),
    ({"nameOverride": "n" * 63}, "glm"),
])
def test_long_names_are_truncated_to_63(render: Render, values: dict[str, Any],
                                        release: str) -> None:
    values = {**values, "watchNamespaces": ["team-a"],
              "metrics": {"serviceMonitor": {"enabled": True},
                          "prometheusRule": {"enabled": True}, "dashboard": {"enabled": True},
                          "prometheusAdapterRules": {"enabled": True}}}
    objs = render(values, release=release)
    for what, value in _names_and_labels(objs):
        assert len(value) <= 63, (what, value)
    for obj in objs:
        if obj["kind"] != "CustomResourceDefinition":
            assert DNS_LABEL.match(obj["metadata"]["name"]), obj["metadata"]["name"]
    names = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]
    assert len(names) == len(set(names)), "two objects got the same truncated name"
    services = sorted(o["metadata"]["name"] for o in find(objs, "Service"))
    assert [s.rsplit("-", 1)[1] for s in services] == ["metrics", "webhook"]
    assert all(s[0].isalpha() for s in services)
    assert one(objs, "Role", namespace="glm-system")["metadata"]["name"].endswith(
        "-leader-election")


# --- values and schema ---------------------------------------------------------------------------


@pytest.mark.parametrize("values,fragment", [
    ({"replicaCont": 2}, "replicaCont"),
    ({"leaderElection": {"leaseDurationSecond": 20}}, "leaseDurationSecond"),
    ({"config": {"probes": {"loadThroughput": 50}}}, "loadThroughput"),
    ({"config": {"gatewayPrt": 9000}}, "gatewayPrt"),
    ({"metrics": {"serviceMonitor": {"enable": True}}}, "enable"),
    ({"securityContext": {"readOnlyRootFileSystem": True}}, "readOnlyRootFileSystem"),
    ({"image": {"tag": "latest"}}, "tag"),
    ({"logFormat": "yaml"}, "logFormat"),
    ({"watchNamespaces": ["Team_A"]}, "watchNamespaces"),
    ({"config": {"prometheus": {"url": "prometheus:9090"}}}, "url"),
])
def test_schema_rejects_typos_and_bad_values(helm: Helm, values: dict[str, Any],
                                             fragment: str) -> None:
    message = helm_fails(helm, values)
    assert "values don't meet the specifications of the schema" in message, message
    assert fragment in message, message


def _schema() -> Obj:
    schema: Obj = json.loads((CHART / "values.schema.json").read_text())
    return schema


def _objects_without_closed_properties(schema: Obj, path: str = "") -> Iterable[str]:
    if schema.get("type") == "object" and "properties" in schema:
        if schema.get("additionalProperties") is not False:
            yield path or "(root)"
        for key, sub in schema["properties"].items():
            yield from _objects_without_closed_properties(sub, f"{path}.{key}")
    for key in ("items",):
        if isinstance(schema.get(key), dict):
            yield from _objects_without_closed_properties(schema[key], f"{path}[]")


def test_every_object_with_known_keys_is_closed() -> None:
    assert list(_objects_without_closed_properties(_schema())) == []


def _fields(model: type[BaseModel]) -> dict[str, Any]:
    """camelCase field name -> nested fields (a dict) or None, from the pydantic model."""
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        alias = field.alias or name
        annotation = field.annotation
        nested = annotation if isinstance(annotation, type) and issubclass(
            annotation, BaseModel) else None
        out[alias] = _fields(nested) if nested else None
    return out


def _schema_fields(schema: Obj) -> dict[str, Any]:
    return {key: _schema_fields(sub) if "properties" in sub else None
            for key, sub in schema["properties"].items()}


def test_config_schema_has_exactly_the_keys_of_operator_config() -> None:
    expected = _fields(OperatorConfig)
    # The image comes from `image.registry` / `image.tag`: one value for the operator's own
    # image and the images it runs.
    del expected["imageRegistry"], expected["imageTag"]
    del expected["eppImage"]  # from `image.epp`, beside the operator's own image
    assert _schema_fields(_schema()["properties"]["config"]) == expected


def _config(objs: list[Obj]) -> Obj:
    data: Obj = yaml.safe_load(one(objs, "ConfigMap")["data"]["config.yaml"])
    return data


def test_default_config_writes_only_the_image(render: Render) -> None:
    config = _config(render())
    assert config == {"imageRegistry": "ghcr.io/glm-operator", "imageTag": __version__}
    assert OperatorConfig.model_validate(config) == OperatorConfig()


FULL_CONFIG: Obj = {
    "gatewayPort": 9080, "enginePort": 9081, "runAsUser": 1001, "runAsGroup": 1002,
    "defaultStorageClass": "fast-nvme", "clusterDomain": "corp.local",
    "capabilityRecheckSeconds": 30,
    "imageArchitectures": {"registry.example.com/mirror/vllm-ascend": ["arm64"]},
    "acceleratorProfiles": {"cpu": {"memoryMiB": 262144, "cpuCores": 32}},
    "probes": {"loadThroughputMibPerSecond": 200, "startupMarginSeconds": 60,
               "vllmStartupExtraSeconds": 600, "startupPeriodSeconds": 5,
               "minStartupSeconds": 120, "livenessPeriodSeconds": 20,
               "livenessFailureThreshold": 3, "readinessPeriodSeconds": 2, "timeoutSeconds": 5},
    "termination": {"endpointRemovalSeconds": 15, "decodeTokensPerSecond": 30.0,
                    "cpuDecodeTokensPerSecond": 3.0, "exitMarginSeconds": 10},
    "gatewayResources": {"cpuRequest": "200m", "memoryRequest": "64Mi", "cpuLimit": "2",
                         "memoryLimit": "256Mi"},
    "routerResources": {"cpuRequest": "150m", "memoryRequest": "96Mi", "cpuLimit": "2",
                        "memoryLimit": "384Mi"},
    "eppResources": {"cpuRequest": "300m", "memoryRequest": "512Mi", "cpuLimit": "3",
                     "memoryLimit": "2Gi"},
    "fetch": {"backoffLimit": 5, "minThroughputMibPerSecond": 20, "minDeadlineSeconds": 600,
              "unknownSizeDeadlineSeconds": 7200, "defaultCacheSize": "200Gi",
              "resources": {"cpuRequest": "1", "memoryRequest": "1Gi", "cpuLimit": "4",
                            "memoryLimit": "2Gi"}},
    "prometheus": {"url": "http://prometheus-operated.monitoring:9090", "timeoutSeconds": 3},
    "rollout": {"drainSeconds": 30, "minProgressDeadlineSeconds": 600,
                "progressDeadlineMarginSeconds": 120},
}


def test_every_config_key_reaches_the_operator(render: Render) -> None:
    config = _config(render({"config": FULL_CONFIG, "image": {"tag": "0.3.1"}}))
    assert config == {"imageRegistry": "ghcr.io/glm-operator", "imageTag": "0.3.1",
                      **FULL_CONFIG}
    loaded = OperatorConfig.model_validate(config)
    dumped = loaded.model_dump(by_alias=True, mode="json")
    for key, value in FULL_CONFIG.items():
        if key != "acceleratorProfiles":
            assert dumped[key] == value, key
    assert loaded.profiles["cpu"].cpu_cores == 32


def test_the_endpoint_picker_image_reaches_the_operator_only_when_set(render: Render) -> None:
    image = "registry.example/mirror/epp:v1.5.0"
    config = _config(render({"image": {"epp": image}}))
    assert config["eppImage"] == image
    assert OperatorConfig.model_validate(config).epp_image == image
    assert "eppImage" not in _config(render())  # the control: the operator's default stands


def test_prometheus_is_written_only_when_its_url_is_set(render: Render) -> None:
    assert "prometheus" not in _config(render())
    url = "http://prometheus-operated.monitoring:9090"
    config = _config(render({"config": {"prometheus": {"url": url}}}))
    assert config["prometheus"] == {"url": url}
    assert OperatorConfig.model_validate(config).prometheus.url == url


def test_a_config_change_rolls_the_operator(render: Render) -> None:
    def checksum(values: dict[str, Any]) -> str:
        annotations = one(render(values), "Deployment")["spec"]["template"]["metadata"][
            "annotations"]
        return str(annotations["checksum/config"])
    assert checksum({}) != checksum({"config": {"gatewayPort": 9000}})


def test_every_value_is_commented() -> None:
    """Each key of values.yaml has a comment right above it (literal sub-objects excepted)."""
    documented_blocks = {"podSecurityContext", "securityContext", "labels"}
    lines = (CHART / "values.yaml").read_text().splitlines()
    parents: list[tuple[int, str]] = []
    missing = []
    for index, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z_][\w]*):", line)
        if not match:
            continue
        indent, key = len(match.group(1)), match.group(2)
        while parents and parents[-1][0] >= indent:
            parents.pop()
        previous = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        in_block = any(p in documented_blocks for _, p in parents)
        if not previous.strip().startswith("#") and not in_block:
            is_section = index + 1 < len(lines) and re.match(
                rf"^\s{{{indent + 2}}}#", lines[index + 1] or "")
            if not is_section:
                missing.append(key)
        parents.append((indent, key))
    assert missing == []


# --- CRDs ----------------------------------------------------------------------------------------


def test_crds_are_templated_with_keep_and_match_the_generated_ones(render: Render) -> None:
    objs = render()
    for crd in find(objs, "CustomResourceDefinition"):
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        generated = yaml.safe_load((REPO / "crds" / f"{crd['spec']['group']}_"
                                    f"{crd['spec']['names']['plural']}.yaml").read_text())
        # The conversion webhook's clientConfig is the release's (the chart's own test:
        # test_conversion_webhook_chart.py); everything else is as generated.
        rendered_client = crd["spec"].get("conversion", {}).get("webhook", {}).pop(
            "clientConfig", None)
        generated["spec"].get("conversion", {}).get("webhook", {}).pop("clientConfig", None)
        if rendered_client is not None:
            assert rendered_client["service"]["name"] == "glm-glm-operator-webhook"
            assert rendered_client["caBundle"]
        assert crd["spec"] == generated["spec"]
        assert crd["metadata"]["labels"] == generated["metadata"]["labels"]
    assert not find(render({"crds": {"enabled": False}}), "CustomResourceDefinition")
    unkept = render({"crds": {"keep": False, "annotations": {"a": "b"}}})
    for crd in find(unkept, "CustomResourceDefinition"):
        assert crd["metadata"]["annotations"] == {"a": "b"}
    assert not (CHART / "crds").exists(), "helm would install crds/ once and never upgrade it"


# --- monitoring ----------------------------------------------------------------------------------


def _known_metrics() -> set[str]:
    """Every metric name the operator and gateway code defines."""
    import contextlib
    import importlib

    from prometheus_client import REGISTRY

    for module in ("glm_operator.controllers.metrics", "glm_operator.kube.client",
                   "glm_operator.kube.lease", "glm_operator.decide.rollout"):
        with contextlib.suppress(ImportError):  # rollout.py: the rollout counter, once there
            importlib.import_module(module)
    names = set()
    for family in REGISTRY.collect():
        names |= {family.name, family.name + "_total", family.name + "_bucket"}
    from glm_operator.gateway import metrics as gateway_metrics

    names |= {v for k, v in vars(gateway_metrics).items() if k.isupper() and isinstance(v, str)}
    names |= {n + "_bucket" for n in names}
    return names


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(glm_[a-z_]+)", expr))


def test_monitoring_objects_follow_their_switches(render: Render) -> None:
    objs = render({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
                               "prometheusRule": {"enabled": True},
                               "dashboard": {"enabled": True, "namespace": "grafana"}}})
    monitor = one(objs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    service = one(objs, "Service", "glm-glm-operator-metrics")
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    # It selects the metrics Service only, not the webhook's.
    selected = [o["metadata"]["name"] for o in find(objs, "Service")
                if monitor["spec"]["selector"]["matchLabels"].items()
                <= o["metadata"]["labels"].items()]
    assert selected == ["glm-glm-operator-metrics"]
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    dashboard = one(objs, "ConfigMap", namespace="grafana")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["glm-operator.json"])["uid"] == "glm-operator"
    assert one(objs, "PrometheusRule")
    assert not find(render(), "ServiceMonitor") and not find(render(), "PrometheusRule")


def test_alerts_cover_the_failures_and_use_metrics_the_code_exports(render: Render) -> None:
    rule = one(render({"metrics": {"prometheusRule": {"enabled": True}}}), "PrometheusRule")
    alerts = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"]}
    assert set(alerts) == {"GLMOperatorDown", "GLMOperatorNoLeader",
                           "GLMOperatorReconcileErrors", "GLMServicePlanInfeasible",
                           "GLMServiceRolledBack", "GLMModelFetchFailed"}
    known = _known_metrics()
    for name, alert in alerts.items():
        assert 'job="glm-glm-operator-metrics"' in alert["expr"] or name == "GLMModelFetchFailed"
        assert _metric_names(alert["expr"]) <= known, (name, alert["expr"])
        assert alert["labels"]["severity"] in ("warning", "critical")
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]


def test_dashboard_queries_use_metrics_the_code_exports() -> None:
    dashboard = json.loads((CHART / "files" / "dashboards" / "glm-operator.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    used = set().union(*(_metric_names(e) for e in exprs))
    assert used <= _known_metrics(), used - _known_metrics()
    assert {"glm_operator_leader", "glm_operator_reconciles_total",
            "glm_operator_api_requests_total"} <= used


def test_shipped_prometheus_adapter_files_are_the_catalogues_rules() -> None:
    """Both files are generated (tests/api/test_crds.py finds them stale); the docs point at
    them instead of repeating the rules."""
    from glm_operator.render.scaling_metrics import SIGNALS, adapter_config

    config = yaml.safe_load((CHART / "files" / "prometheus-adapter-rules.yaml").read_text())
    values = yaml.safe_load((CHART / "files" / "prometheus-adapter-values.yaml").read_text())
    assert config == adapter_config()
    assert values == {"rules": {"custom": adapter_config()["rules"]}}
    assert {r["name"]["as"] for r in config["rules"]} == {s.hpa_metric for s in SIGNALS}
    docs = (REPO / "docs" / "autoscaling.md").read_text()
    assert "files/prometheus-adapter-rules.yaml" in docs and "seriesQuery" not in docs
    for signal in SIGNALS:  # the docs' table names every target and its metric
        assert f"| `{signal.target_field}` | `{signal.hpa_metric}` |" in docs, signal


def test_prometheus_adapter_rules_configmap_for_rules_existing(render: Render) -> None:
    from glm_operator.render.scaling_metrics import adapter_config

    assert not find(render(), "ConfigMap", namespace="monitoring")
    objs = render({"metrics": {"prometheusAdapterRules": {"enabled": True,
                                                          "namespace": "monitoring"}}})
    rules = one(objs, "ConfigMap", namespace="monitoring")
    assert rules["metadata"]["name"] == "glm-glm-operator-prometheus-adapter"
    # The prometheus-adapter chart mounts rules.existing and runs --config=.../config.yaml.
    assert list(rules["data"]) == ["config.yaml"]
    assert yaml.safe_load(rules["data"]["config.yaml"]) == adapter_config()
