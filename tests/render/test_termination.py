"""How a model pod stops: the gateway serves on while the endpoints drop the pod (preStop),
drains for the longest generation the pool allows (bounded by spec.gateway.maxDrainSeconds),
and the engine and a group's workers outlive the drain; the grace covers all of it."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pytest
from glm_operator.config import OperatorConfig
from glm_operator.gateway import config as gateway_config
from glm_operator.render.pod import longest_generation_seconds, termination
from glm_operator.render.service import Capabilities, render_service, rendered_service

from render.cases import (
    GOLDEN_SPECS,
    MULTI_NODE_CASES,
    golden_inputs,
    inputs,
    model_version,
    multi_node_inputs,
    service,
)

Obj = dict[str, Any]


def pod_templates(objects: list[Obj]) -> list[Obj]:
    out = []
    for o in objects:
        if o["kind"] in ("Deployment", "StatefulSet"):
            out.append(o["spec"]["template"]["spec"])
        elif o["kind"] == "LeaderWorkerSet":
            lwt = o["spec"]["leaderWorkerTemplate"]
            out += [lwt["leaderTemplate"]["spec"], lwt["workerTemplate"]["spec"]]
    return out


def containers(pod: Obj) -> dict[str, Obj]:
    return {c["name"]: c for c in pod["containers"]}


def sleep(container: Obj) -> int:
    seconds: int = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    return seconds


def drain_flag(gateway: Obj) -> float:
    parser = argparse.ArgumentParser()
    gateway_config.add_arguments(parser)
    drain: float = gateway_config.from_args(parser.parse_args(gateway["args"][1:])).drain_seconds
    return drain


def short_context_service(context: int = 2048, **gateway: Any) -> Any:
    return service("llamacpp", "a10", contextLength=context,
                   gateway={"apiKeysSecret": "chat-keys", **gateway})


def test_the_drain_is_the_longest_generation_at_the_decode_floor() -> None:
    # 2048 tokens per request at 20 tokens/s: 103 s, under the 300 s bound.
    case = inputs(short_context_service(), model_version("gguf"))
    deployment = next(o for o in render_service(case) if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    gateway, engine = containers(pod)["gateway"], containers(pod)["engine"]
    assert drain_flag(gateway) == 103 == math.ceil(2048 / 20)
    assert sleep(gateway) == 10  # the endpoints drop the pod while it still serves
    assert sleep(engine) == 10 + 103  # the engine outlives the gateway's drain
    assert pod["terminationGracePeriodSeconds"] == 10 + 103 + 5


def test_the_field_bounds_the_drain() -> None:
    capped = inputs(short_context_service(maxDrainSeconds=45), model_version("gguf"))
    pod = pod_templates(render_service(capped))[0]
    assert drain_flag(containers(pod)["gateway"]) == 45
    assert pod["terminationGracePeriodSeconds"] == 60
    shortest = inputs(short_context_service(maxDrainSeconds=1), model_version("gguf"))
    pod = pod_templates(render_service(shortest))[0]
    assert drain_flag(containers(pod)["gateway"]) == 1
    assert sleep(containers(pod)["engine"]) == sleep(containers(pod)["gateway"]) + 1 == 11
    assert pod["terminationGracePeriodSeconds"] == 16


def test_a_long_context_pool_drains_by_its_own_plan_and_cpu_by_its_own_floor() -> None:
    svc = service("llamacpp", "a10", contextLength=2048,
                  longContext={"enabled": True, "contextLength": 4096},
                  gateway={"apiKeysSecret": "chat-keys", "maxDrainSeconds": 3600})
    by_pool = {o["metadata"]["labels"]["glm-operator.dev/pool"]: o["spec"]["template"]["spec"]
               for o in render_service(inputs(svc, model_version("gguf")))
               if o["kind"] == "Deployment"}
    assert drain_flag(containers(by_pool["main"])["gateway"]) == math.ceil(2048 / 20)
    assert drain_flag(containers(by_pool["long-context"])["gateway"]) == math.ceil(4096 / 20)
    cpu = golden_inputs("llamacpp", "cpu")
    ctx = rendered_service(cpu)  # 4096 tokens per slot on CPU at 2 tokens/s: capped
    assert ctx.objects
    pod = pod_templates(ctx.objects)[0]
    assert drain_flag(containers(pod)["gateway"]) == 300


def test_the_decode_floor_is_operator_config() -> None:
    config = OperatorConfig(imageTag="0.1.0", termination={
        "endpointRemovalSeconds": 20, "decodeTokensPerSecond": 64, "exitMarginSeconds": 10})
    case = inputs(short_context_service(), model_version("gguf"), config=config)
    pod = pod_templates(render_service(case))[0]
    assert drain_flag(containers(pod)["gateway"]) == 32  # 2048 / 64
    assert sleep(containers(pod)["gateway"]) == 20
    assert pod["terminationGracePeriodSeconds"] == 20 + 32 + 10


@pytest.mark.parametrize("case", sorted(GOLDEN_SPECS))
def test_every_pod_stops_in_order_within_its_grace(case: tuple[str, str]) -> None:
    for pod in pod_templates(render_service(golden_inputs(*case))):
        by_name = containers(pod)
        gateway = by_name["gateway"]
        drain = drain_flag(gateway)
        assert sleep(by_name["engine"]) == sleep(gateway) + drain
        assert pod["terminationGracePeriodSeconds"] > sleep(by_name["engine"])
        assert 0 < drain <= 300


@pytest.mark.parametrize("case", sorted(MULTI_NODE_CASES))
@pytest.mark.parametrize("lws", [False, True])
def test_a_groups_workers_outlive_the_leaders_drain(case: str, lws: bool) -> None:
    objects = render_service(multi_node_inputs(case, Capabilities(leader_worker_set=lws)))
    pods = pod_templates(objects)
    leaders = [p for p in pods if "gateway" in containers(p)]
    workers = [p for p in pods if "worker" in containers(p)]
    assert leaders and workers
    engine_wait = sleep(containers(leaders[0])["engine"])
    grace = leaders[0]["terminationGracePeriodSeconds"]
    for worker in workers:
        assert sleep(containers(worker)["worker"]) == engine_wait
        assert worker["terminationGracePeriodSeconds"] == grace


def test_ray_heads_keep_their_post_start_beside_the_pre_stop() -> None:
    objects = render_service(multi_node_inputs("vllm-h100x8x2"))
    leader = next(p for p in pod_templates(objects) if "gateway" in containers(p))
    lifecycle = containers(leader)["engine"]["lifecycle"]
    assert set(lifecycle) == {"postStart", "preStop"}


def test_longest_generation_reads_the_context_per_request() -> None:
    case = golden_inputs("vllm", "a10")
    from glm_operator.render.pod import PoolContext
    ctx = PoolContext(service=case.service, model_version=case.model_version, plan=case.plan,
                      config=case.config, pool="main", namespace="models")
    assert case.plan.vllm is not None
    assert longest_generation_seconds(ctx) == math.ceil(case.plan.vllm.max_model_len / 20)
    assert termination(ctx).drain_seconds == min(300, longest_generation_seconds(ctx))
