"""What an engine container on Huawei Ascend NPUs needs beyond its devices.

The Ascend device plugin hands a pod its `/dev/davinciN` and the management devices
(`davinci_manager`, `devmm_svm`, `hisi_hdc`) and sets ASCEND_VISIBLE_DEVICES. The rest comes
from the node, and from the pod spec unless Ascend Docker Runtime is installed as the
container runtime (MindCluster's way: it mounts them itself):

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
"""

from __future__ import annotations

from typing import Any

from glm_operator.config import OperatorConfig
from glm_operator.planning.accelerators import AcceleratorProfile

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
