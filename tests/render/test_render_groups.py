"""Multi-node replicas (accelerator.nodes > 1): golden files for both renderings of the one
group model (StatefulSets + headless Service, and LeaderWorkerSet), invariants, wiring."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from glm_operator.render.groups import (
    GROUP_LABEL,
    GROUP_ROLE_LABEL,
    LWS_LEADER_ADDRESS_ENV,
    STATEFULSET_POD_NAME_LABEL,
)
from glm_operator.render.output import to_yaml
from glm_operator.render.pod import POD_NAME_ENV
from glm_operator.render.service import Capabilities, render_service

from render.cases import MULTI_NODE_CASES, multi_node_inputs
from render.golden import check_golden
from render.invariants import problems

CASES = sorted(MULTI_NODE_CASES)
LWS = Capabilities(leader_worker_set=True)

# The LeaderWorkerSet API (leaderworkerset.x-k8s.io/v1), field by field as its Go types
# declare them: sigs.k8s.io/lws api/leaderworkerset/v1/leaderworkerset_types.go (read at
# commit 024af0845195be26fb4a0847c37d7209849d69da). The module proxy refuses the module
# here, so the list is copied, not generated.
LWS_SPEC_FIELDS = {"replicas", "leaderWorkerTemplate", "rolloutStrategy", "startupPolicy",
                   "networkConfig"}
LWS_TEMPLATE_FIELDS = {"leaderTemplate", "workerTemplate", "size", "restartPolicy",
                       "subGroupPolicy", "volumeClaimTemplates",
                       "persistentVolumeClaimRetentionPolicy"}
LWS_ENUMS = {
    ("startupPolicy",): {"LeaderCreated", "LeaderReady"},
    ("leaderWorkerTemplate", "restartPolicy"): {"Default", "RecreateGroupOnPodRestart",
                                                "RecreateGroupAfterStart", "None"},
    ("rolloutStrategy", "type"): {"RollingUpdate"},
    ("networkConfig", "subdomainPolicy"): {"Shared", "UniquePerReplica"},
}
LWS_ROLLING_UPDATE_FIELDS = {"partition", "maxUnavailable", "maxSurge"}


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def argv(container: dict[str, Any]) -> list[str]:
    return [*container["command"], *container["args"]]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize("case", CASES)
def test_golden_statefulsets(case: str) -> None:
    check_golden(f"groups-{case}.yaml", to_yaml(render_service(multi_node_inputs(case))))


@pytest.mark.parametrize("case", CASES)
def test_golden_leader_worker_set(case: str) -> None:
    objects = render_service(multi_node_inputs(case, LWS))
    check_golden(f"lws-{case}.yaml", to_yaml(objects))


@pytest.mark.parametrize("capabilities", [None, LWS], ids=["statefulsets", "lws"])
@pytest.mark.parametrize("case", CASES)
def test_invariants_hold(case: str, capabilities: Capabilities | None) -> None:
    assert problems(render_service(multi_node_inputs(case, capabilities))) == []


def test_statefulsets_one_leader_set_and_one_worker_set_per_group() -> None:
    objects = render_service(multi_node_inputs("llamacpp-a10x4x3"))  # 2 groups of 3 nodes
    leader, *workers = by_kind(objects, "StatefulSet")
    assert by_kind(objects, "Deployment") == []
    assert leader["spec"]["replicas"] == 2
    assert [w["metadata"]["name"] for w in workers] == [f"{leader['metadata']['name']}-{g}"
                                                        for g in range(2)]
    for w in workers:
        assert w["spec"]["replicas"] == 2 and w["spec"]["ordinals"] == {"start": 1}
        assert w["spec"]["serviceName"] == leader["spec"]["serviceName"]
    (headless,) = [s for s in by_kind(objects, "Service") if s["spec"].get("clusterIP") == "None"]
    assert headless["metadata"]["name"] == leader["spec"]["serviceName"]
    assert headless["spec"]["publishNotReadyAddresses"] is True
    for sts in (leader, *workers):
        assert all(headless["spec"]["selector"][k] == v
                   for k, v in sts["spec"]["template"]["metadata"]["labels"].items()
                   if k in headless["spec"]["selector"])
        assert set(headless["spec"]["selector"]) <= set(
            sts["spec"]["template"]["metadata"]["labels"])


def test_leader_names_every_worker_of_its_group_by_stable_hostname() -> None:
    objects = render_service(multi_node_inputs("llamacpp-a10x4x3"))
    leader, *workers = by_kind(objects, "StatefulSet")
    engine = leader["spec"]["template"]["spec"]["containers"][0]
    assert engine["env"][0] == {"name": POD_NAME_ENV,
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    service, namespace = leader["spec"]["serviceName"], leader["metadata"]["namespace"]
    for g, w in enumerate(workers):
        leader_pod = f"{leader['metadata']['name']}-{g}"
        rpc = flag(argv(engine), "--rpc").replace(f"$({POD_NAME_ENV})", leader_pod)
        worker_pods = [f"{w['metadata']['name']}-{i}" for i in range(1, 1 + w["spec"]["replicas"])]
        assert rpc.split(",") == [f"{p}.{service}.{namespace}.svc.cluster.local:50052"
                                  for p in worker_pods]
        (container,) = w["spec"]["template"]["spec"]["containers"]
        assert argv(container)[:5] == ["ggml-rpc-server", "--host", "0.0.0.0", "--port", "50052"]
        # The workers get the weights over RPC: no model volume.
        assert "model" not in {v["name"] for v in w["spec"]["template"]["spec"]["volumes"]}


def test_a_llamacpp_leader_waits_for_its_workers_before_the_engine_starts() -> None:
    """llama-server aborts when an --rpc worker does not answer; the init container waits
    for exactly the addresses the engine will connect to."""
    for case, leader_workers_set in (("llamacpp-a10x4x3", None), ("llamacpp-a10x4x3", LWS)):
        objects = render_service(multi_node_inputs(case, leader_workers_set))
        if leader_workers_set is None:
            pod = by_kind(objects, "StatefulSet")[0]["spec"]["template"]["spec"]
        else:
            pod = by_kind(objects, "LeaderWorkerSet")[0]["spec"]["leaderWorkerTemplate"][
                "leaderTemplate"]["spec"]
        (wait,) = pod["initContainers"]
        engine = pod["containers"][0]
        assert wait["command"] == ["glm-operator"] and wait["args"][0] == "wait-tcp"
        assert wait["args"][1:] == flag(argv(engine), "--rpc").split(",")
        assert wait["env"] == [{"name": POD_NAME_ENV,
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
        assert wait["securityContext"]["readOnlyRootFilesystem"] is True
    vllm = render_service(multi_node_inputs("vllm-h100x8x2"))
    assert "initContainers" not in by_kind(vllm, "StatefulSet")[0]["spec"]["template"]["spec"]


def test_tensor_split_covers_every_device_of_the_group_workers_first() -> None:
    inputs = multi_node_inputs("llamacpp-a10x4x3")
    (leader, *_) = by_kind(render_service(inputs), "StatefulSet")
    engine = leader["spec"]["template"]["spec"]["containers"][0]
    split = [int(n) for n in flag(argv(engine), "--tensor-split").split(",")]
    assert len(split) == 3 * 4 and sum(split) == int(flag(argv(engine), "--n-gpu-layers"))
    per_node = inputs.plan.per_node
    assert [n.role for n in per_node] == ["leader", "worker", "worker"]
    assert per_node[0].layers == sum(split[-4:])  # llama-server lists its RPC devices first
    assert [n.layers for n in per_node[1:]] == [sum(split[0:4]), sum(split[4:8])]


def test_group_pods_are_placed_one_per_node_on_the_profiles_nodes() -> None:
    objects = render_service(multi_node_inputs("llamacpp-a10x4x3"))
    leader, *workers = by_kind(objects, "StatefulSet")
    leader_affinity = leader["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    for g, w in enumerate(workers):
        pod = w["spec"]["template"]["spec"]
        assert pod["affinity"]["nodeAffinity"] == leader_affinity
        terms = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        leader_pod = f"{leader['metadata']['name']}-{g}"
        assert {tuple(t["labelSelector"]["matchLabels"].items()) for t in terms} == {
            ((GROUP_LABEL, leader_pod),), ((STATEFULSET_POD_NAME_LABEL, leader_pod),)}
        assert {t["topologyKey"] for t in terms} == {"kubernetes.io/hostname"}
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"


def test_pool_service_selects_leaders_only() -> None:
    objects = render_service(multi_node_inputs("llamacpp-a10x4x3"))
    (main,) = [s for s in by_kind(objects, "Service") if s["metadata"]["name"] == "chat"]
    leader, *workers = by_kind(objects, "StatefulSet")
    selector = main["spec"]["selector"]
    labels = leader["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in selector.items())
    for w in workers:
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert not all(labels.get(k) == v for k, v in selector.items())
        assert labels[GROUP_ROLE_LABEL] == "worker"


def test_vllm_group_runs_pipeline_parallel_over_ray() -> None:
    objects = render_service(multi_node_inputs("vllm-h100x8x2"))
    leader, worker = by_kind(objects, "StatefulSet")
    engine = leader["spec"]["template"]["spec"]["containers"][0]
    args = argv(engine)
    assert flag(args, "--tensor-parallel-size") == "8"
    assert flag(args, "--pipeline-parallel-size") == "2"
    assert flag(args, "--distributed-executor-backend") == "ray"
    assert engine["lifecycle"]["postStart"]["exec"]["command"][:3] == ["ray", "start", "--head"]
    assert {"name": "RAY_ADDRESS", "value": "127.0.0.1:6379"} in engine["env"]
    (container,) = worker["spec"]["template"]["spec"]["containers"]
    host = (f"{leader['metadata']['name']}-0.{leader['spec']['serviceName']}"
            ".models.svc.cluster.local")
    assert argv(container)[:4] == ["ray", "start", f"--address={host}:6379", "--block"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    mounts = {m["name"] for m in container["volumeMounts"]}
    assert {"model", "dshm"} <= mounts  # every rank reads its shard; NCCL's shared memory


def test_network_policy_admits_the_group_and_the_gateway_port_only() -> None:
    objects = render_service(multi_node_inputs("llamacpp-a10x4x3"))
    (policy,) = by_kind(objects, "NetworkPolicy")
    members = policy["spec"]["podSelector"]["matchLabels"]
    assert policy["spec"]["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": members}}]},
        {"ports": [{"protocol": "TCP", "port": 8080}]},
    ]
    for sts in by_kind(objects, "StatefulSet"):
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in members.items())


def test_autoscaled_groups_start_at_min_replicas_and_the_hpa_owns_the_leader_set() -> None:
    autoscaling = {"minReplicas": 2, "maxReplicas": 4, "targets": {"queueLength": 4}}
    inputs = multi_node_inputs("llamacpp-a10x4x3", replicas=None, autoscaling=autoscaling)
    objects = render_service(inputs)
    (hpa,) = by_kind(objects, "HorizontalPodAutoscaler")
    leader, *workers = by_kind(objects, "StatefulSet")
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
    assert hpa["spec"]["scaleTargetRef"]["name"] == leader["metadata"]["name"]
    assert "replicas" not in leader["spec"] and len(workers) == 2
    assert leader["metadata"]["annotations"]["glm-operator.dev/initial-replicas"] == "2"
    # Scaled to 3 groups by the HPA: a third worker set, the leader set still hands-off.
    scaled = render_service(replace(inputs, live_groups=3))
    leader, *workers = by_kind(scaled, "StatefulSet")
    assert "replicas" not in leader["spec"]
    assert [w["metadata"]["name"] for w in workers] == [
        f"{leader['metadata']['name']}-{g}" for g in range(3)]


def test_leader_worker_set_uses_only_its_published_fields() -> None:
    objects = render_service(multi_node_inputs("vllm-h100x8x2", LWS))
    assert by_kind(objects, "StatefulSet") == []
    (lws,) = by_kind(objects, "LeaderWorkerSet")
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    spec = lws["spec"]
    assert set(spec) <= LWS_SPEC_FIELDS
    assert set(spec["leaderWorkerTemplate"]) <= LWS_TEMPLATE_FIELDS
    assert set(spec["rolloutStrategy"]["rollingUpdateConfiguration"]) <= LWS_ROLLING_UPDATE_FIELDS
    for path, allowed in LWS_ENUMS.items():
        value: Any = spec
        for key in path:
            value = value[key]
        assert value in allowed, path
    assert spec["replicas"] == 1 and spec["leaderWorkerTemplate"]["size"] == 2
    lwt = spec["leaderWorkerTemplate"]
    (worker,) = lwt["workerTemplate"]["spec"]["containers"]
    assert f"--address=$({LWS_LEADER_ADDRESS_ENV}):6379" in argv(worker)
    for template in (lwt["leaderTemplate"], lwt["workerTemplate"]):
        (term,) = template["spec"]["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["matchLabelKeys"] == ["leaderworkerset.sigs.k8s.io/group-key"]


def test_both_renderings_name_the_same_hosts() -> None:
    """LeaderWorkerSet names its pods <lws>-<g> and <lws>-<g>-<w> under a headless Service
    <lws> (subdomainPolicy Shared): the leader argv is the same in both renderings."""
    sts = by_kind(render_service(multi_node_inputs("llamacpp-a10x4x3")), "StatefulSet")[0]
    (lws,) = by_kind(render_service(multi_node_inputs("llamacpp-a10x4x3", LWS)),
                     "LeaderWorkerSet")
    assert lws["metadata"]["name"] == sts["metadata"]["name"] == sts["spec"]["serviceName"]
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert argv(leader) == argv(sts["spec"]["template"]["spec"]["containers"][0])
