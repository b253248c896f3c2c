"""Engine pods on Ascend NPUs: the node's driver, the device group, CANN's writable paths."""

from __future__ import annotations

from typing import Any

from glm_operator.config import OperatorConfig
from glm_operator.render.ascend import ASCEND_ENV, DRIVER_PATHS
from glm_operator.render.service import render_service

from render.cases import inputs, model_key, model_version, multi_node_inputs, service


def pods(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o["spec"]["template"]["spec"] for o in objects
            if o["kind"] in ("Deployment", "StatefulSet")]


def engine_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in pod["containers"] if c["name"] != "gateway"]


def rendered(engine: str, accelerator: str, config: OperatorConfig | None = None
             ) -> list[dict[str, Any]]:
    svc = service(engine, accelerator)
    return render_service(inputs(svc, model_version(model_key(engine, accelerator)), config))


def test_ascend_pods_mount_the_driver_read_only_join_its_group_and_write_under_tmp() -> None:
    for engine in ("llamacpp", "vllm"):
        for pod in pods(rendered(engine, "ascend910b")):
            assert pod["securityContext"]["supplementalGroups"] == [1000]
            assert pod["securityContext"]["runAsUser"] == 65532  # still non-root
            host_paths = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
            assert host_paths == {name: {"path": path, "type": kind}
                                  for name, path, kind in DRIVER_PATHS}
            for c in engine_containers(pod):
                mounts = {m["name"]: m for m in c["volumeMounts"]}
                for name, path, _ in DRIVER_PATHS:
                    assert mounts[name] == {"name": name, "mountPath": path, "readOnly": True}
                env = {e["name"]: e.get("value") for e in c["env"]}
                for key, value in ASCEND_ENV:
                    assert env[key] == value and value.startswith("/tmp/")
                assert c["securityContext"]["readOnlyRootFilesystem"] is True


def test_with_ascend_docker_runtime_nothing_is_mounted_from_the_host() -> None:
    config = OperatorConfig(imageTag="0.1.0", ascend={"driverMounts": "Runtime",
                                                     "deviceGroup": 1201})
    for pod in pods(rendered("vllm", "ascend910b", config)):
        assert not [v for v in pod["volumes"] if "hostPath" in v]
        assert pod["securityContext"]["supplementalGroups"] == [1201]


def test_other_accelerators_get_none_of_it() -> None:
    for engine, accelerator in (("llamacpp", "cpu"), ("vllm", "a10"), ("llamacpp", "a10")):
        for pod in pods(rendered(engine, accelerator)):
            assert "supplementalGroups" not in pod["securityContext"]
            assert not [v for v in pod["volumes"] if "hostPath" in v]
            env = {e["name"] for c in pod["containers"] for e in c.get("env", [])}
            assert not env & {key for key, _ in ASCEND_ENV}


def test_every_pod_of_an_ascend_group_reaches_its_node_s_driver() -> None:
    objects = render_service(multi_node_inputs("vllm-910bx8x2"))
    group_pods = pods(objects)
    assert len(group_pods) == 2  # the leader set and one worker set
    for pod in group_pods:
        assert pod["securityContext"]["supplementalGroups"] == [1000]
        for c in engine_containers(pod):
            assert {m["mountPath"] for m in c["volumeMounts"]} >= {p for _, p, _ in DRIVER_PATHS}
            assert {e["name"] for e in c["env"]} >= {key for key, _ in ASCEND_ENV}
