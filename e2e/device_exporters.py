"""Stand-ins for the device exporters the shipped prometheus-adapter rules read: NVIDIA's
dcgm-exporter and Huawei's Ascend npu-exporter, serving their series for fake pods.

The series names, units and labels are the exporters' own, spelled here from their
documentation and source, independently of the rule catalogue (render/scaling_metrics.py):
a rule that names a series or label the real exporter does not publish finds nothing here.

- dcgm-exporter (github.com/NVIDIA/dcgm-exporter, default counters): `DCGM_FI_DEV_FB_USED`
  and `DCGM_FI_DEV_FB_FREE`, framebuffer MiB, per GPU (`gpu`, `UUID`, `device`,
  `modelName`, `Hostname`), with the Kubernetes pod that holds the GPU as `namespace`, `pod`
  and `container` (its pod-resources mapping).
- npu-exporter (Ascend mind-cluster): `npu_chip_info_hbm_used_memory` and
  `npu_chip_info_hbm_total_memory`, HBM MB, per chip (`id`, `model_name`, `vdie_id`,
  `pcie_bus_info`), with the container that holds the chip as `namespace`, `pod_name` and
  `container_name`.

    with DcgmExporter() as dcgm:
        dcgm.set_gpu(0, "ns", "pod-a", used_mib=18000, free_mib=5000)
        prometheus.add_target("dcgm", dcgm.address, {"namespace": "gpu-operator",
                                                     "pod": "dcgm-exporter-x"},
                              honor_labels=False)  # pod -> exported_pod
"""

from __future__ import annotations

from types import TracebackType

from prometheus_client import CollectorRegistry, Gauge, start_http_server

# dcgm-exporter
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"
DCGM_FB_FREE = "DCGM_FI_DEV_FB_FREE"
DCGM_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "container", "namespace",
               "pod")
# npu-exporter
NPU_HBM_USED = "npu_chip_info_hbm_used_memory"
NPU_HBM_TOTAL = "npu_chip_info_hbm_total_memory"
NPU_LABELS = ("id", "model_name", "vdie_id", "pcie_bus_info", "namespace", "pod_name",
              "container_name")


class _Exporter:
    """A /metrics endpoint on 127.0.0.1:<free port> with its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._server, self._thread = start_http_server(0, addr="127.0.0.1",
                                                       registry=self.registry)
        self.port = int(self._server.server_port)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> _Exporter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class DcgmExporter(_Exporter):
    def __init__(self, hostname: str = "gpu-a10-1", model: str = "NVIDIA A10") -> None:
        super().__init__()
        self.hostname = hostname
        self.model = model
        self.used = Gauge(DCGM_FB_USED, "Framebuffer memory used (in MiB).", DCGM_LABELS,
                          registry=self.registry)
        self.free = Gauge(DCGM_FB_FREE, "Framebuffer memory free (in MiB).", DCGM_LABELS,
                          registry=self.registry)

    def set_gpu(self, gpu: int, namespace: str, pod: str, used_mib: float, free_mib: float,
                container: str = "engine") -> None:
        labels = {"gpu": str(gpu), "UUID": f"GPU-{gpu:08d}-e2e", "device": f"nvidia{gpu}",
                  "modelName": self.model, "Hostname": self.hostname, "container": container,
                  "namespace": namespace, "pod": pod}
        self.used.labels(**labels).set(used_mib)
        self.free.labels(**labels).set(free_mib)

    def __enter__(self) -> DcgmExporter:
        return self


class NpuExporter(_Exporter):
    def __init__(self, model: str = "Ascend910B") -> None:
        super().__init__()
        self.model = model
        self.used = Gauge(NPU_HBM_USED, "the npu hbm used memory", NPU_LABELS,
                          registry=self.registry)
        self.total = Gauge(NPU_HBM_TOTAL, "the npu hbm total memory", NPU_LABELS,
                           registry=self.registry)

    def set_chip(self, chip: int, namespace: str, pod: str, used_mb: float, total_mb: float,
                 container: str = "engine") -> None:
        labels = {"id": str(chip), "model_name": self.model, "vdie_id": f"e2e-vdie-{chip}",
                  "pcie_bus_info": f"0000:{chip + 1:02x}:00.0", "namespace": namespace,
                  "pod_name": pod, "container_name": container}
        self.used.labels(**labels).set(used_mb)
        self.total.labels(**labels).set(total_mb)

    def __enter__(self) -> NpuExporter:
        return self
