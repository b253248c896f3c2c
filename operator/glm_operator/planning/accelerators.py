"""The accelerator catalog: every hardware fact the planner and the renderers use, in one place.

Memory per device is what the device reports as usable (GPU Feature Discovery's
`nvidia.com/gpu.memory` label, in MiB, is the same number nvidia-smi prints), not the
marketing figure: an A10 is sold as 24 GB and reports 23028 MiB (22.5 GiB).

Users add or override profiles through operator config; `load_profiles(extra)`
(planning/profile_config.py) merges and validates them. Pure data: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from glm_operator import __version__
from glm_operator.planning.architectures import BOTH, Architecture, check_architectures

MiB = 1024**2
GiB = 1024**3

Vendor = Literal["nvidia", "huawei", "cpu"]
Engine = Literal["llamacpp", "vllm"]
ENGINES: tuple[Engine, ...] = ("llamacpp", "vllm")
VENDORS: tuple[Vendor, ...] = ("nvidia", "huawei", "cpu")

# Our own runtime images (runtime-images/) live under this registry unless operator config
# says otherwise; upstream vLLM images are used as published. Tags are pinned, never latest.
# vLLM: the newest release on PyPI (0.33.0), which has GLM-5 (GlmMoeDsaForCausalLM) and
# GLM-5-Next in its model registry. vllm-ascend follows vLLM's numbers but lags it: its newest
# release, v0.23.0.post1, is built on vLLM v0.23.0 (its Dockerfile's VLLM_TAG) and serves GLM-5
# since v0.17.0rc1, so each is pinned on its own.
DEFAULT_IMAGE_REGISTRY = "ghcr.io/glm-operator"
VLLM_CUDA_IMAGE = "vllm/vllm-openai:v0.33.0"
VLLM_ASCEND_IMAGE = "quay.io/ascend/vllm-ascend:v0.23.0.post1"


@dataclass(frozen=True)
class Toleration:
    key: str
    effect: str = "NoSchedule"
    operator: str = "Exists"
    value: str | None = None

    def to_dict(self) -> dict[str, str]:
        out = {"key": self.key, "operator": self.operator, "effect": self.effect}
        if self.value is not None:
            out["value"] = self.value
        return out


@dataclass(frozen=True)
class AcceleratorProfile:
    """One kind of device (or a CPU-only node) that a replica runs on."""

    name: str
    vendor: Vendor
    # Usable memory of one device as it reports it; for `cpu`, the node RAM a replica may use.
    memory_bytes: int
    # Extended resource requested per device; None for CPU.
    resource_name: str | None
    # label -> accepted values (any of); rendered as node affinity `In` expressions.
    node_labels: Mapping[str, tuple[str, ...]]
    tolerations: tuple[Toleration, ...]
    engines: tuple[Engine, ...]
    # engine -> image; llama.cpp images are ours, vLLM images upstream's.
    images: Mapping[Engine, str]
    # Tensor-parallel pods never span nodes: a replica's device count must be <= this.
    max_devices_per_node: int
    flash_attention: bool  # llama.cpp flash-attention kernels (needed for a quantized V cache)
    bf16: bool  # native bf16 (V100 has none: vLLM then runs float16)
    fp8: bool  # fp8 weights / fp8 KV cache in vLLM
    # Memory the runtime takes before any model byte (CUDA context, cuBLAS/NCCL workspaces;
    # the CANN runtime; for CPU, the OS and the engine process itself).
    runtime_overhead_bytes: int = 512 * MiB
    # CPU cores per node that one replica may use (CPU profile sizes threads from it).
    cpu_cores: int = 8
    # The CPU architectures (kubernetes.io/arch) of the profile's nodes: every pod is pinned
    # to those of them its images have builds for (planning/architectures.py).
    architectures: tuple[Architecture, ...] = BOTH
    description: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)
    # NVIDIA: the SM version (75 Turing T4, 80 A100, 89 Ada, 90 Hopper, 100 Blackwell B200):
    # picks vLLM's fp8 KV spelling (fp8_e4m3 on Blackwell) and whether our llama.cpp CUDA
    # image has kernels for it (LLAMACPP_CUDA_SM). None: unknown (operator-config profiles).
    cuda_sm: int | None = None
    # Devices of a node joined by NVLink (or HCCS): tensor parallelism's all-reduce per layer
    # is cheap. GeForce cards and the T4 talk over PCIe only: split layers, not tensors.
    nvlink: bool = True

    def __post_init__(self) -> None:
        if not self.name or self.name != self.name.lower():
            raise ValueError(f"profile name must be a non-empty lower-case name: {self.name!r}")
        if self.vendor not in VENDORS:
            raise ValueError(f"profile {self.name}: vendor must be one of {VENDORS}")
        if self.memory_bytes <= 0:
            raise ValueError(f"profile {self.name}: memory must be > 0")
        if self.max_devices_per_node < 1:
            raise ValueError(f"profile {self.name}: maxDevicesPerNode must be >= 1")
        if not self.engines or any(e not in ENGINES for e in self.engines):
            raise ValueError(f"profile {self.name}: engines must be a subset of {ENGINES}")
        for engine in self.engines:
            image = self.images.get(engine)
            if not image:
                raise ValueError(f"profile {self.name}: no image for engine {engine}")
            check_pinned_image(image, where=f"profile {self.name}")
        check_architectures(self.architectures, where=f"profile {self.name}: architectures")
        if self.vendor != "cpu" and not self.resource_name:
            raise ValueError(f"profile {self.name}: a {self.vendor} profile needs a resourceName")

    @property
    def is_cpu(self) -> bool:
        return self.vendor == "cpu"

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (status, docs, `glm-operator plan`)."""
        return {
            "name": self.name,
            "vendor": self.vendor,
            "memoryBytes": self.memory_bytes,
            "resourceName": self.resource_name,
            "nodeLabels": {k: list(v) for k, v in self.node_labels.items()},
            "tolerations": [t.to_dict() for t in self.tolerations],
            "engines": list(self.engines),
            "images": dict(self.images),
            "maxDevicesPerNode": self.max_devices_per_node,
            "flashAttention": self.flash_attention,
            "bf16": self.bf16,
            "fp8": self.fp8,
            "runtimeOverheadBytes": self.runtime_overhead_bytes,
            "cpuCores": self.cpu_cores,
            "architectures": list(self.architectures),
        }


def check_pinned_image(image: str, *, where: str) -> None:
    name, _, tag = image.rpartition(":")
    if "@sha256:" in image:
        return
    if not name or "/" in tag or not tag or tag == "latest":
        raise ValueError(f"{where}: image {image!r} must carry a pinned tag (never latest)")


def runtime_images(
    registry: str = DEFAULT_IMAGE_REGISTRY, tag: str = __version__
) -> dict[str, str]:
    """Our llama.cpp runtime images (runtime-images/llamacpp), one per backend."""
    registry = registry.rstrip("/")
    return {
        "llamacpp-cuda": f"{registry}/llama-server-cuda:{tag}",
        "llamacpp-cpu": f"{registry}/llama-server-cpu:{tag}",
        "llamacpp-cann": f"{registry}/llama-server-cann:{tag}",
    }


# The SM versions our llama.cpp CUDA image is compiled for (runtime-images/llamacpp/
# Dockerfile.cuda CUDA_ARCHITECTURES; tests/images holds the two equal). A newer GPU runs the
# newest one's PTX, JIT-compiled at load; an older one has no kernels at all.
LLAMACPP_CUDA_SM: tuple[int, ...] = (75, 80, 86, 89, 90, 100)

_NVIDIA_TOLERATIONS = (Toleration("nvidia.com/gpu"),)
_GFD_PRODUCT = "nvidia.com/gpu.product"


def _nvidia(
    name: str,
    mib: int,
    products: tuple[str, ...],
    *,
    images: Mapping[str, str],
    bf16: bool = True,
    fp8: bool = False,
    max_devices: int = 8,
    engines: tuple[Engine, ...] = ("llamacpp", "vllm"),
    nvlink: bool = True,
    description: str,
) -> AcceleratorProfile:
    sm = re.search(r"sm_(\d+)", description)
    return AcceleratorProfile(
        name=name,
        vendor="nvidia",
        memory_bytes=mib * MiB,
        resource_name="nvidia.com/gpu",
        node_labels={_GFD_PRODUCT: products},
        tolerations=_NVIDIA_TOLERATIONS,
        engines=engines,
        images={e: images["llamacpp-cuda"] if e == "llamacpp" else VLLM_CUDA_IMAGE
                for e in engines},
        max_devices_per_node=max_devices,
        flash_attention=True,
        bf16=bf16,
        fp8=fp8,
        runtime_overhead_bytes=512 * MiB,
        cpu_cores=8,
        # x86 hosts, and arm64 ones: Grace (GH200, GB200) and Ampere Altra servers.
        architectures=BOTH,
        description=description,
        cuda_sm=int(sm.group(1)) if sm else None,
        nvlink=nvlink,
    )


def builtin_profiles(
    registry: str = DEFAULT_IMAGE_REGISTRY, tag: str = __version__
) -> dict[str, AcceleratorProfile]:
    """The shipped catalog. Sources for each number are in docs/planning.md."""
    images = runtime_images(registry, tag)
    profiles = [
        _nvidia("nvidia-a10", 23028, ("NVIDIA-A10",), images=images,
                max_devices=4, description="NVIDIA A10 24 GB (Ampere, sm_86)"),
        _nvidia("nvidia-l4", 23034, ("NVIDIA-L4",), images=images, fp8=True,
                description="NVIDIA L4 24 GB (Ada, sm_89)"),
        _nvidia("nvidia-a100-40gb", 40960,
                ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"), images=images,
                description="NVIDIA A100 40 GB (Ampere, sm_80)"),
        _nvidia("nvidia-a100-80gb", 81920,
                ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"), images=images,
                description="NVIDIA A100 80 GB (Ampere, sm_80)"),
        _nvidia("nvidia-h100-80gb", 81559,
                ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe"), images=images, fp8=True,
                description="NVIDIA H100 80 GB (Hopper, sm_90)"),
        _nvidia("nvidia-h200", 143771, ("NVIDIA-H200", "NVIDIA-H200-NVL"), images=images,
                fp8=True, description="NVIDIA H200 141 GB (Hopper, sm_90)"),
        # vLLM only: our llama.cpp CUDA image is built with CUDA 13, which has no sm_70
        # target (runtime-images/llamacpp/Dockerfile.cuda); llama.cpp on V100 needs a profile
        # in operator config with a CUDA 12 build of it.
        _nvidia("nvidia-v100-32gb", 32768,
                ("Tesla-V100-SXM2-32GB", "Tesla-V100-PCIE-32GB"), images=images, bf16=False,
                engines=("vllm",),
                description="NVIDIA V100 32 GB (Volta, sm_70): no bf16, no fp8; vLLM only "
                "(the llama.cpp CUDA image, CUDA 13, has no sm_70 kernels)"),
        # Hopper for export: Hopper's memory and fp8, less compute (H20) or NVLink bandwidth
        # (H800); Ampere's A800 likewise. vLLM's GLM-5.1 recipe names 8 x H20.
        _nvidia("nvidia-h20", 97871, ("NVIDIA-H20",), images=images, fp8=True,
                description="NVIDIA H20 96 GB (Hopper, sm_90)"),
        _nvidia("nvidia-h800", 81559, ("NVIDIA-H800", "NVIDIA-H800-PCIe"), images=images,
                fp8=True, description="NVIDIA H800 80 GB (Hopper, sm_90)"),
        _nvidia("nvidia-a800", 81920, ("NVIDIA-A800-SXM4-80GB", "NVIDIA-A800-80GB-PCIe"),
                images=images, description="NVIDIA A800 80 GB (Ampere, sm_80)"),
        _nvidia("nvidia-l20", 46068, ("NVIDIA-L20",), images=images, fp8=True, nvlink=False,
                description="NVIDIA L20 48 GB (Ada, sm_89), PCIe"),
        _nvidia("nvidia-b200", 183359, ("NVIDIA-B200",), images=images, fp8=True,
                description="NVIDIA B200 180 GB (Blackwell, sm_100)"),
        # Turing has no bf16 (vLLM runs float16) and no fp8; llama.cpp's CUDA image carries
        # sm_75 kernels for it.
        _nvidia("nvidia-t4", 15360, ("Tesla-T4",), images=images, bf16=False, nvlink=False,
                description="NVIDIA T4 16 GB (Turing, sm_75), PCIe"),
        _nvidia("nvidia-rtx-4090", 24564, ("NVIDIA-GeForce-RTX-4090",), images=images,
                fp8=True, max_devices=4, nvlink=False,
                description="NVIDIA GeForce RTX 4090 24 GB (Ada, sm_89), PCIe, no NVLink"),
        _nvidia("nvidia-rtx-4060", 8188, ("NVIDIA-GeForce-RTX-4060",), images=images,
                fp8=True, max_devices=4, nvlink=False,
                description="NVIDIA GeForce RTX 4060 8 GB (Ada, sm_89), PCIe, no NVLink"),
        AcceleratorProfile(
            name="ascend-910c",
            vendor="huawei",
            # Atlas 800 A3: 8 Ascend 910C modules of two dies each, every die an NPU of 64 GB
            # HBM that the device plugin counts as one huawei.com/Ascend910: 16 per node.
            memory_bytes=65536 * MiB,
            resource_name="huawei.com/Ascend910",
            node_labels={
                "accelerator": ("huawei-Ascend910",),
                "accelerator-type": ("module-a3-16", "module-a3-16-super-pod"),
            },
            tolerations=(Toleration("huawei.com/Ascend910"),),
            engines=("llamacpp", "vllm"),
            images={"llamacpp": images["llamacpp-cann"], "vllm": VLLM_ASCEND_IMAGE},
            max_devices_per_node=16,
            flash_attention=True,
            bf16=True,
            fp8=False,
            runtime_overhead_bytes=1536 * MiB,  # CANN runtime and HCCL buffers
            cpu_cores=16,
            architectures=("arm64",),  # Kunpeng 920 hosts
            description="Huawei Ascend 910C in Atlas 800 A3 nodes: 16 NPUs of 64 GB HBM",
        ),
        AcceleratorProfile(
            name="ascend-910b",
            vendor="huawei",
            memory_bytes=65536 * MiB,  # 910B1/B2/B3: 64 GB HBM per NPU (npu-smi: 65536 MB)
            resource_name="huawei.com/Ascend910",
            node_labels={
                "accelerator": ("huawei-Ascend910",),
                "accelerator-type": ("module-910b-8", "module-910b-16", "card-910b-2"),
            },
            tolerations=(Toleration("huawei.com/Ascend910"),),
            engines=("llamacpp", "vllm"),
            images={"llamacpp": images["llamacpp-cann"], "vllm": VLLM_ASCEND_IMAGE},
            max_devices_per_node=8,
            flash_attention=True,
            bf16=True,
            fp8=False,
            runtime_overhead_bytes=1536 * MiB,  # CANN runtime and HCCL buffers
            cpu_cores=16,
            # Atlas 800T/800I A2 hosts have Kunpeng 920 CPUs. x86 Atlas servers exist too:
            # set `architectures: [amd64]` (or both) on this profile in operator config, and
            # list an amd64 build of the CANN image in imageArchitectures.
            architectures=("arm64",),
            description="Huawei Ascend 910B (Atlas 800T/800I A2), 64 GB HBM per NPU",
        ),
        AcceleratorProfile(
            name="ascend-310p",
            vendor="huawei",
            memory_bytes=24576 * MiB,  # Atlas 300I Pro: one 310P3 with 24 GB LPDDR4X
            resource_name="huawei.com/Ascend310P",
            node_labels={"accelerator": ("huawei-Ascend310P",)},
            tolerations=(Toleration("huawei.com/Ascend310P"),),
            engines=("llamacpp", "vllm"),
            images={"llamacpp": images["llamacpp-cann"], "vllm": VLLM_ASCEND_IMAGE},
            max_devices_per_node=8,
            flash_attention=False,
            bf16=False,
            fp8=False,
            runtime_overhead_bytes=1024 * MiB,
            cpu_cores=8,
            architectures=BOTH,  # a PCIe card: any host, x86 or Kunpeng
            description="Huawei Ascend 310P3 (Atlas 300I Pro 24 GB; the 300I Duo has 48 GB "
            "per chip: override memoryBytes)",
        ),
        AcceleratorProfile(
            name="cpu",
            vendor="cpu",
            memory_bytes=64 * GiB,  # node RAM a replica may use: override in operator config
            resource_name=None,
            node_labels={},
            tolerations=(),
            engines=("llamacpp",),
            images={"llamacpp": images["llamacpp-cpu"]},
            max_devices_per_node=1,
            flash_attention=True,
            bf16=True,
            fp8=False,
            runtime_overhead_bytes=512 * MiB,  # the engine process, tokenizer, HTTP threads
            cpu_cores=8,
            architectures=BOTH,
            description="CPU only (llama.cpp); memory is the node RAM a replica may use",
        ),
    ]
    return {p.name: p for p in profiles}


# The shipped catalog as it is (operator config's additions: planning/profile_config.py).
PROFILES: Mapping[str, AcceleratorProfile] = MappingProxyType(builtin_profiles())


def get_profile(
    name: str, profiles: Mapping[str, AcceleratorProfile] | None = None
) -> AcceleratorProfile:
    catalog = PROFILES if profiles is None else profiles
    try:
        return catalog[name]
    except KeyError:
        raise ValueError(
            f"unknown accelerator profile {name!r}; known: {', '.join(sorted(catalog))}"
        ) from None
