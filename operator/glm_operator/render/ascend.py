"""What an engine container on Huawei Ascend NPUs needs beyond its devices.

The Ascend device plugin (MindCluster `ascend-device-plugin`, `Allocate` in
pkg/server/plugin.go) answers the kubelet in one of two ways. Without Ascend Docker Runtime
it returns device specs: the NPUs it allocated (`/dev/davinciN`) and the management devices
(`/dev/davinci_manager`, `/dev/devmm_svm`, `/dev/hisi_hdc`), and no environment. With it
(`-useAscendDocker`) it returns only ASCEND_VISIBLE_DEVICES (the physical ids) and
ASCEND_RUNTIME_OPTIONS, from which the runtime's prestart hook mounts the devices and the
driver. Neither sets ASCEND_RT_VISIBLE_DEVICES: CANN numbers the NPUs a container sees
0..n-1 by itself, and vLLM's Ray executor sets ASCEND_RT_VISIBLE_DEVICES per worker. So the
pod sets none of the three (they would contradict the allocation). The rest comes from the
node, and from the pod spec unless Ascend Docker Runtime mounts it:

- the driver's user-space libraries and tools, read-only: `/usr/local/Ascend/driver`,
  `/usr/local/dcmi`, `/usr/local/bin/npu-smi`, `/etc/ascend_install.info` (the mounts vllm-ascend's
  installation guide passes to `docker run`). `ascend.driverMounts` in the operator config
  chooses: `HostPath` (the default, works on any runtime) or `Runtime` (none rendered).
- access to the device nodes as a non-root user: the driver creates them mode 0660, group
  HwHiAiUser, so the pod joins that group (`ascend.deviceGroup`, the gid the driver was
  installed with).
- writable places for what CANN writes under $HOME by default on a read-only root
  filesystem: its logs (ASCEND_PROCESS_LOG_PATH), its compiled-kernel cache
  (ASCEND_CACHE_PATH) and its working files (ASCEND_WORK_PATH), all on the pod's /tmp.
- across nodes (a vLLM group), HCCL's host-side socket on the pod's own address:
  HCCL_IF_IP from the downward API (vllm-ascend's multi-node guide sets it to the node's IP
  on every node; in a pod that is the pod IP, which the headless Service resolves to).
- ModelSlim-quantized checkpoints (W8A8: `quant_model_description.json`) served with
  `--quantization ascend`, the method vllm-ascend registers and adds to vLLM's choices
  (vllm_ascend/platform.py, quantization/modelslim_config.py; the GLM-5 guide passes it).
"""

from __future__ import annotations

from typing import Any

from glm_operator.config import OperatorConfig
from glm_operator.planning.accelerators import AcceleratorProfile
from glm_operator.planning.planner import MODELSLIM_QUANTIZATIONS, Plan

ASCEND_ENV: tuple[tuple[str, str], ...] = (
    ("ASCEND_PROCESS_LOG_PATH", "/tmp/ascend/log"),
    ("ASCEND_CACHE_PATH", "/tmp/ascend/cache"),
    ("ASCEND_WORK_PATH", "/tmp/ascend/work"),
)
# (volume name, host path, hostPath type): mounted read-only at the same path.
DRIVER_PATHS: tuple[tuple[str, str, str], ...] = (
    ("ascend-driver", "/usr/local/Ascend/driver", "Directory"),
    ("ascend-dcmi", "/usr/local/dcmi", "Directory"),
    ("ascend-npu-smi", "/usr/local/bin/npu-smi", "File"),
    ("ascend-install-info", "/etc/ascend_install.info", "File"),
)
# What the device plugin (or Ascend Docker Runtime) decides: a pod that set these itself would
# see other NPUs than the ones the scheduler counted for it.
DEVICE_PLUGIN_ENV = ("ASCEND_VISIBLE_DEVICES", "ASCEND_RUNTIME_OPTIONS",
                     "ASCEND_RT_VISIBLE_DEVICES")
HCCL_IF_IP = "HCCL_IF_IP"
VLLM_ASCEND_QUANTIZATION = "ascend"


def is_ascend(profile: AcceleratorProfile) -> bool:
    return profile.vendor == "huawei"


def ascend_env(profile: AcceleratorProfile) -> tuple[tuple[str, str], ...]:
    return ASCEND_ENV if is_ascend(profile) else ()


def driver_mounts(profile: AcceleratorProfile, config: OperatorConfig) -> list[dict[str, Any]]:
    if not is_ascend(profile) or config.ascend.driver_mounts != "HostPath":
        return []
    return [{"name": name, "mountPath": path, "readOnly": True} for name, path, _ in DRIVER_PATHS]


def driver_volumes(profile: AcceleratorProfile, config: OperatorConfig) -> list[dict[str, Any]]:
    if not is_ascend(profile) or config.ascend.driver_mounts != "HostPath":
        return []
    return [{"name": name, "hostPath": {"path": path, "type": kind}}
            for name, path, kind in DRIVER_PATHS]


def device_groups(profile: AcceleratorProfile, config: OperatorConfig) -> list[int]:
    """Supplemental groups an engine pod needs to open its devices."""
    return [config.ascend.device_group] if is_ascend(profile) else []


def group_env(plan: Plan) -> list[dict[str, Any]]:
    """Environment every pod of a multi-node vLLM group on Ascend needs: HCCL's host socket
    on the pod's address. llama.cpp groups talk ggml-rpc over TCP, not HCCL."""
    if not is_ascend(plan.profile) or plan.request.nodes < 2 or plan.vllm is None:
        return []
    return [{"name": HCCL_IF_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]


def vllm_quantization(plan: Plan) -> str | None:
    """vLLM's `--quantization` for the plan: vllm-ascend's method for a ModelSlim checkpoint;
    None where vLLM reads the method from the checkpoint's config.json."""
    if is_ascend(plan.profile) and plan.request.quantization.lower() in MODELSLIM_QUANTIZATIONS:
        return VLLM_ASCEND_QUANTIZATION
    return None
