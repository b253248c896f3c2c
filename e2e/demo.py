"""`make demo`: build what is missing, bring the local cluster up, show what it offers.

First the stage the operator plays on: the fake accelerator nodes (what they advertise to the
scheduler, the labels the operator's node affinity reads, their taints) and the third-party
CRDs the operator integrates with. Then the operator at work (e2e/demo_operator.py): a
GLMService planned, fetched, deployed and Ready, and one chat request served through the
gateway by a real llama-server started with the argv the operator rendered.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from e2e import cluster, demo_operator, toolchain
from e2e.kubectl import Kubectl, KubectlError

ACCELERATOR_RESOURCES = ("nvidia.com/gpu", "huawei.com/Ascend910")
SHOWN_LABELS = (
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.memory",
    "accelerator",
    "accelerator-type",
    "kubernetes.io/arch",
    "node.kubernetes.io/instance-type",
)


def heading(text: str) -> None:
    print(f"\n== {text} ==")


def table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print(("  " + "  ".join(cells)).rstrip())


def accelerators(node: dict[str, Any]) -> str:
    allocatable = node["status"].get("allocatable", {})
    found = [f"{allocatable[r]} x {r}" for r in ACCELERATOR_RESOURCES if r in allocatable]
    return ", ".join(found) or "-"


def show_nodes(kubectl: Kubectl) -> None:
    heading("Nodes (fake, driven by kwok; scheduled by the real kube-scheduler)")
    rows = [["NAME", "READY", "ACCELERATORS", "CPU", "MEMORY", "TAINTS"]]
    nodes = kubectl.items("nodes")
    for node in nodes:
        conditions = node["status"].get("conditions", [])
        ready = next((c["status"] for c in conditions if c["type"] == "Ready"), "Unknown")
        taints = ",".join(f"{t['key']}:{t['effect']}" for t in node["spec"].get("taints", []))
        allocatable = node["status"].get("allocatable", {})
        rows.append([node["metadata"]["name"], ready, accelerators(node),
                     allocatable.get("cpu", "?"), allocatable.get("memory", "?"), taints or "-"])
    table(rows)
    heading("Accelerator labels (what GPU Feature Discovery / the Ascend device plugin publish)")
    for node in nodes:
        labels = node["metadata"].get("labels", {})
        shown = [f"{key}={labels[key]}" for key in SHOWN_LABELS if key in labels]
        print(f"  {node['metadata']['name']:12} {' '.join(shown)}")


def show_crds(kubectl: Kubectl) -> None:
    heading("Third-party CRDs (real schemas from their Go modules)")
    rows = [["CRD", "VERSIONS", "ESTABLISHED"]]
    for crd in kubectl.items("crds"):
        served = ",".join(v["name"] for v in crd["spec"]["versions"] if v.get("served"))
        conditions = crd.get("status", {}).get("conditions", [])
        established = next((c["status"] for c in conditions if c["type"] == "Established"), "?")
        rows.append([crd["metadata"]["name"], served, established])
    table(rows)


def show_storage(kubectl: Kubectl) -> None:
    heading("Storage (default StorageClass, pre-provisioned PersistentVolumes)")
    classes = kubectl.items("storageclasses")
    for storage_class in classes:
        default = storage_class["metadata"].get("annotations", {}).get(
            "storageclass.kubernetes.io/is-default-class") == "true"
        print(f"  StorageClass {storage_class['metadata']['name']}"
              f"{' (default)' if default else ''}: {storage_class['provisioner']}")
    volumes = kubectl.items("pv")
    by_phase: dict[str, int] = {}
    for volume in volumes:
        key = f"{volume['spec']['capacity']['storage']} {volume['status'].get('phase', '?')}"
        by_phase[key] = by_phase.get(key, 0) + 1
    print("  PersistentVolumes: " + ", ".join(f"{n} x {k}" for k, n in sorted(by_phase.items())))


def main() -> int:
    started = time.monotonic()
    try:
        cluster.build_missing()
        kubectl = cluster.up()
    except (cluster.ClusterError, toolchain.BuildError, KubectlError, AssertionError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    server = json.loads(kubectl("get", "--raw=/version").stdout)
    print(f"\nLocal Kubernetes {server['gitVersion']} is up "
          f"({time.monotonic() - started:.1f}s). Try it:")
    print(f"  export KUBECONFIG={cluster.kubeconfig_path()}")
    print("  kubectl get nodes -L nvidia.com/gpu.product,accelerator-type")
    show_nodes(kubectl)
    show_storage(kubectl)
    show_crds(kubectl)
    print(f"\nkubectl: {cluster.Binaries.from_cache().kubectl}")
    return demo_operator.run(kubectl)


if __name__ == "__main__":
    sys.exit(main())
