"""Multi-node replicas (accelerator.nodes > 1): one group of pods per replica, one per node.

One group model (`GroupModel`), rendered two ways with the same names and hostnames:

* StatefulSets, run by the kube-controller-manager every cluster has: a leader StatefulSet
  `<set>` whose replicas are the groups (leader pods `<set>-<g>`), one worker StatefulSet per
  group `<set>-<g>` (pods `<set>-<g>-<w>`, ordinals from 1), and a headless Service `<set>`
  that gives every pod the stable name `<pod>.<set>.<namespace>.svc.<cluster domain>`. A
  StatefulSet has one pod template, and leaders and workers run different containers, so
  the leaders are one StatefulSet and each group's workers another: the layout the
  LeaderWorkerSet controller itself creates.
* A LeaderWorkerSet (`leaderworkerset.x-k8s.io/v1`) when its CRD is served; its controller
  makes the same StatefulSets and headless Service, and adds group-level restarts
  (RecreateGroupOnPodRestart), group-by-group rolling updates and one scale subresource.

The leader runs the engine's server and the gateway (it is the pod the pool's Service
selects); workers run llama.cpp's ggml-rpc-server or a vLLM Ray node. Pods of a group land on
distinct nodes of the accelerator profile (the profile's node affinity plus a required pod
anti-affinity between the pods of one group). "All or nothing": a group serves only when
every pod of it runs (llama-server loads nothing without its RPC workers, vLLM's Ray
executor waits for every worker); neither rendering gang-schedules, so a group whose
workers cannot be placed holds the nodes its placed pods took until they can.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

from glm_operator.render.ascend import driver_mounts, group_env
from glm_operator.render.autoscaling import ScaleTarget
from glm_operator.render.deployment import INITIAL_REPLICAS_ANNOTATION, plan_hash, pool_labels
from glm_operator.render.engine_args import (
    RPC_PORT,
    ray_worker_argv,
    rpc_server_argv,
)
from glm_operator.render.environment import render_object
from glm_operator.render.meta import object_meta
from glm_operator.render.names import (
    SERVICE_LABEL,
    VERSION_LABEL,
    common_labels,
    dns_name,
    label_value,
    pool_selector,
)
from glm_operator.render.pod import (
    HOSTNAME_TOPOLOGY,
    MODEL_MOUNT,
    POD_NAME_ENV,
    POD_NAME_VAR,
    PoolContext,
    container_security_context,
    engine_env,
    engine_image,
    engine_pod_security_context,
    engine_resources,
    gateway_resources,
    placement,
    pod_spec,
    pre_stop_sleep,
    pull_secrets,
    termination,
    volumes,
)
from glm_operator.wellknown import PLAN_HASH_ANNOTATION, PREFIX

GROUP_ROLE_LABEL = f"{PREFIX}/group-role"  # leader | worker
GROUP_SET_LABEL = f"{PREFIX}/group-set"  # the set (leader StatefulSet / LeaderWorkerSet)
GROUP_LABEL = f"{PREFIX}/group"  # a worker's group: its leader's pod name
LEADER, WORKER = "leader", "worker"
WORKER_CONTAINER = "worker"
WORKER_COMPONENT = "engine-worker"  # a worker pod's app.kubernetes.io/component
WAIT_CONTAINER = "wait-for-workers"  # a llama.cpp leader's init container
# Labels the workload controllers put on pods (StatefulSet; LeaderWorkerSet, from
# sigs.k8s.io/lws api/leaderworkerset/v1/leaderworkerset_types.go).
STATEFULSET_POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
LWS_GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
LWS_LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
LEADER_WORKER_SET_CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
# <set>-<group>-<worker> must stay a 63-character hostname and <set>-<group> leave room for
# the StatefulSet's controller-revision-hash label (<name>-<10 characters>): groups up to
# 999 (replicas <= 1000) and 16 nodes.
SET_NAME_LIMIT = 47

Obj = dict[str, Any]


def group_set_name(service: str, version: str) -> str:
    return dns_name(service, version, limit=SET_NAME_LIMIT)


@dataclass(frozen=True)
class GroupModel:
    """Every multi-node fact both renderings share."""

    ctx: PoolContext
    name: str  # the set: leader StatefulSet / LeaderWorkerSet / headless Service
    size: int  # pods per group (nodes)
    groups: int  # groups running now: the worker StatefulSets to render
    # The set's replicas in the intent; None when an autoscaler sizes it (whole groups):
    # created with `groups`, then left to the HPA / ScaledObject.
    replicas: int | None = None

    def set_meta(self, owner: Obj | None) -> Obj:
        annotations = ({INITIAL_REPLICAS_ANNOTATION: str(self.groups)}
                       if self.replicas is None else None)
        return object_meta(self.name, self.namespace,
                           {**self.set_labels(), GROUP_ROLE_LABEL: LEADER}, owner, annotations)

    @property
    def namespace(self) -> str:
        return self.ctx.namespace

    def hostname(self, pod: str) -> str:
        """The stable DNS name the headless Service gives a pod of the set."""
        return f"{pod}.{self.name}.{self.namespace}.svc.{self.ctx.config.cluster_domain}"

    def rpc_servers(self) -> tuple[str, ...]:
        """The leader's workers, named after the leader's own pod name (the kubelet expands
        $(VAR) in args): one leader template serves every group."""
        if self.ctx.engine != "llamacpp":
            return ()
        return tuple(f"{self.hostname(f'$({POD_NAME_ENV})-{w}')}:{RPC_PORT}"
                     for w in range(1, self.size))

    def set_labels(self) -> dict[str, str]:
        return {**pool_labels(self.ctx), GROUP_SET_LABEL: self.name}

    def leader_selector(self) -> dict[str, str]:
        return {**pool_selector(self.ctx.service_name, self.ctx.version, self.ctx.pool),
                GROUP_ROLE_LABEL: LEADER}

    def leader_pod_labels(self) -> dict[str, str]:
        labels = {**self.set_labels(), GROUP_ROLE_LABEL: LEADER}
        overrides = self.ctx.service.spec.pod_overrides
        if overrides is not None:
            labels = {**(overrides.labels or {}), **labels}
        return labels

    def worker_labels(self) -> dict[str, str]:
        """No pool label: the pool's Service selects leaders only (workers serve no HTTP)."""
        labels = common_labels(self.ctx.service_name, WORKER_COMPONENT)
        labels[VERSION_LABEL] = label_value(self.ctx.version)
        labels[GROUP_SET_LABEL] = self.name
        labels[GROUP_ROLE_LABEL] = WORKER
        return labels

    def pod_annotations(self) -> dict[str, str]:
        overrides = self.ctx.service.spec.pod_overrides
        annotations = dict(overrides.annotations or {}) if overrides is not None else {}
        annotations[PLAN_HASH_ANNOTATION] = plan_hash(self.ctx.plan)
        return annotations

    def leader_pod(self, anti_affinity: list[Obj]) -> Obj:
        spec = pod_spec(replace(self.ctx, rpc_servers=self.rpc_servers()))
        if self.rpc_servers():
            spec["initContainers"] = [self._wait_for_workers()]
        return _with_anti_affinity(spec, anti_affinity)

    def _wait_for_workers(self) -> Obj:
        """llama-server aborts when an --rpc worker does not answer, and a container that
        keeps exiting backs off for up to five minutes: the leader waits for its workers'
        ports first (`glm-operator wait-tcp`, from the gateway's image)."""
        config = self.ctx.config
        return {
            "name": WAIT_CONTAINER,
            "image": config.operator_image,
            "command": ["glm-operator"],
            "args": ["wait-tcp", *self.rpc_servers()],
            "env": [POD_NAME_VAR],
            "resources": gateway_resources(config),
            "securityContext": container_security_context(config),
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }

    def worker_pod(self, leader_address: str, anti_affinity: list[Obj]) -> Obj:
        ctx = self.ctx
        spec: Obj = {
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": engine_pod_security_context(ctx),
            **pull_secrets(ctx.config),
            **placement(ctx),
        }
        spec["terminationGracePeriodSeconds"] = termination(ctx).grace_seconds
        spec["containers"] = [self._worker_container(leader_address)]
        names = {m["name"] for m in spec["containers"][0]["volumeMounts"]}
        spec["volumes"] = [v for v in volumes(ctx) if v["name"] in names]
        return _with_anti_affinity(spec, anti_affinity)

    def _worker_container(self, leader_address: str) -> Obj:
        ctx = self.ctx
        overrides = ctx.service.spec.pod_overrides
        user_env = {e.name: e.value for e in (overrides.env or [])} if overrides else {}
        mounts: list[Obj] = [{"name": "tmp", "mountPath": "/tmp"}]
        probes: Obj = {}
        if ctx.engine == "llamacpp":
            # The leader sends the weights over RPC: the worker reads no model file.
            argv = rpc_server_argv(ctx.plan)
            env = dict(engine_env(ctx))
            tcp = {"tcpSocket": {"port": RPC_PORT}, "timeoutSeconds": 5}
            probes = {"readinessProbe": {**tcp, "periodSeconds": 5, "failureThreshold": 3},
                      "livenessProbe": {**tcp, "periodSeconds": 20, "failureThreshold": 6}}
        else:
            # Ray runs this node's vLLM workers; each reads its own shard of the model.
            argv = ray_worker_argv(leader_address)
            env = dict(engine_env(ctx))
            mounts.insert(0, {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
            if ctx.plan.resources.shared_memory_bytes:
                mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        mounts += driver_mounts(ctx.plan.profile, ctx.config)  # the node's devices, as the leader
        env.update(user_env)
        return {
            "name": WORKER_CONTAINER,
            "image": engine_image(ctx),
            "command": argv[:1],
            "args": argv[1:],
            "env": [*({"name": k, "value": v} for k, v in env.items()), *group_env(ctx.plan)],
            # As the leader's engine: a worker stopped first would fail the group's
            # generations while the leader's gateway drains them.
            "lifecycle": pre_stop_sleep(termination(ctx).engine_wait_seconds),
            "resources": engine_resources(ctx),
            "volumeMounts": mounts,
            **probes,
            "securityContext": container_security_context(ctx.config),
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }


def _anti_affinity_term(selector: dict[str, str], match_label_keys: list[str] | None = None
                        ) -> Obj:
    term: Obj = {"labelSelector": {"matchLabels": selector}, "topologyKey": HOSTNAME_TOPOLOGY}
    if match_label_keys:
        term["matchLabelKeys"] = match_label_keys
    return term


def _with_anti_affinity(spec: Obj, terms: list[Obj]) -> Obj:
    if not terms:
        return spec
    affinity = spec.setdefault("affinity", {})
    anti = affinity.setdefault("podAntiAffinity", {})
    anti.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).extend(terms)
    return spec


def group_scale_target(set_name: str, leader_worker_set: bool) -> ScaleTarget:
    """What an autoscaler resizes to add or remove whole groups: the LeaderWorkerSet, or the
    leader StatefulSet (whose scale selector picks the leaders, where the gateways run)."""
    if leader_worker_set:
        return ScaleTarget(set_name, "LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1")
    return ScaleTarget(set_name, "StatefulSet", "apps/v1")


def group_model(ctx: PoolContext, replicas: int | None, groups: int) -> GroupModel:
    """`replicas`: the set's size in the intent (None: autoscaled); `groups`: how many run
    now (the autoscaler's live count, or `replicas`)."""
    return GroupModel(ctx=ctx, name=group_set_name(ctx.service_name, ctx.version),
                      size=ctx.plan.request.nodes, groups=groups, replicas=replicas)


def build_network_policy(model: GroupModel, owner: Obj | None) -> Obj:
    """ggml-rpc-server and Ray answer anyone who connects (no authentication): the pods of a set
    accept connections from each other, and from elsewhere only on the gateway's port (which
    only the leaders listen on)."""
    labels = common_labels(model.ctx.service_name, "engine-group")
    labels[VERSION_LABEL] = label_value(model.ctx.version)
    members = {GROUP_SET_LABEL: model.name}
    return render_object(
        "networkpolicy.yaml.j2",
        metadata=object_meta(model.name, model.namespace, labels, owner),
        selector=members,
        ingress=[{"from": [{"podSelector": {"matchLabels": members}}]},
                 {"ports": [{"protocol": "TCP", "port": model.ctx.config.gateway_port}]}],
    )


# ---------------------------------------------------------------- StatefulSets


def build_headless_service(model: GroupModel, owner: Obj | None) -> Obj:
    """Stable hostnames for every pod of the set; not-ready pods too (a leader loads only
    once it reaches its workers, a vLLM worker joins its leader before either is ready)."""
    labels = common_labels(model.ctx.service_name, "engine-group")
    labels[VERSION_LABEL] = label_value(model.ctx.version)
    return render_object(
        "headless-service.yaml.j2",
        metadata=object_meta(model.name, model.namespace, labels, owner),
        selector={SERVICE_LABEL: label_value(model.ctx.service_name),
                  VERSION_LABEL: label_value(model.ctx.version), GROUP_SET_LABEL: model.name},
    )


def build_statefulsets(model: GroupModel, owner: Obj | None) -> list[Obj]:
    """The leader StatefulSet (one leader per group) and one worker StatefulSet per group
    running: an autoscaler resizes the leader set, and the operator follows with the
    workers' sets."""
    leader = render_object(
        "statefulset.yaml.j2",
        metadata=model.set_meta(owner),
        replicas=model.replicas,
        ordinals_start=None,
        service_name=model.name,
        selector=model.leader_selector(),
        pod_labels=model.leader_pod_labels(),
        pod_annotations=model.pod_annotations(),
        # Leaders need no term of their own: the scheduler honours a pod's required
        # anti-affinity in both directions, and the workers carry it.
        pod_spec=model.leader_pod([]),
    )
    out = [leader]
    for g in range(model.groups):
        leader_pod = f"{model.name}-{g}"
        group = {**model.worker_labels(), GROUP_LABEL: leader_pod}
        selector = {SERVICE_LABEL: group[SERVICE_LABEL], VERSION_LABEL: group[VERSION_LABEL],
                    GROUP_LABEL: leader_pod}
        terms = [_anti_affinity_term({GROUP_LABEL: leader_pod}),
                 _anti_affinity_term({STATEFULSET_POD_NAME_LABEL: leader_pod})]
        out.append(render_object(
            "statefulset.yaml.j2",
            metadata=object_meta(leader_pod, model.namespace, group, owner),
            replicas=model.size - 1,
            ordinals_start=1,
            service_name=model.name,
            selector=selector,
            pod_labels=group,
            pod_annotations=model.pod_annotations(),
            pod_spec=model.worker_pod(model.hostname(leader_pod), terms),
        ))
    return out


# ---------------------------------------------------------------- LeaderWorkerSet


def build_leader_worker_set(model: GroupModel, owner: Obj | None) -> Obj:
    """The same groups as one LeaderWorkerSet (fields from sigs.k8s.io/lws
    api/leaderworkerset/v1/leaderworkerset_types.go). Its controller makes the headless
    Service `<set>` (subdomainPolicy Shared) and injects LWS_LEADER_ADDRESS; the pods of a
    group share its group-key label, which the anti-affinity matches on."""
    term = _anti_affinity_term({GROUP_SET_LABEL: model.name}, [LWS_GROUP_KEY_LABEL])
    return render_object(
        "leaderworkerset.yaml.j2",
        metadata=model.set_meta(owner),
        replicas=model.replicas,
        size=model.size,
        leader_labels=model.leader_pod_labels(),
        pod_annotations=model.pod_annotations(),
        leader_pod=model.leader_pod([term]),
        worker_labels=model.worker_labels(),
        worker_pod=model.worker_pod(f"$({LWS_LEADER_ADDRESS_ENV})", [copy.deepcopy(term)]),
    )
