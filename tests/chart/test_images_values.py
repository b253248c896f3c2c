"""`glm-operator images --values` maps the chart's values to the operator config as the chart
does: `chart_config` against the config.yaml of the ConfigMap that the real `helm template`
writes, for value sets that exercise each rule of templates/_helpers.tpl."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helm import CHART, KUBE_VERSION, Helm  # tests/chart is on sys.path
from glm_operator.images import chart_config, config_from_values, merge_values

Obj = dict[str, Any]
Render = Callable[..., list[Obj]]
INSTALL_MD = Path(__file__).resolve().parents[2] / "docs" / "install.md"


def _mirror_values() -> Obj:
    """docs/install.md's mirror values (YAML anchors included: helm must read them too)."""
    section = INSTALL_MD.read_text().split("## Mirrors and air-gapped clusters", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    values: Obj = yaml.safe_load(block)
    return values


CASES: dict[str, Obj] = {
    "defaults": {},
    "registry-slash-and-tag": {"image": {"registry": "registry.example/ml/", "tag": "0.2.0"}},
    "empty-tag-is-app-version": {"image": {"registry": "mirror.example/glm", "tag": ""}},
    "epp": {"image": {"epp": "registry.example/mirror/epp:v1.5.0"}},
    "empty-epp-keeps-the-default": {"image": {"epp": ""}},
    "null-and-empty-keys-are-left-out": {"config": {"gatewayPort": None, "probes": {},
                                                    "defaultStorageClass": "fast"}},
    "config": {"config": {
        "enginePort": 9081, "clusterDomain": "corp.local",
        "acceleratorProfiles": {"cpu": {"memoryMiB": 262144, "cpuCores": 32}},
        "fetch": {"backoffLimit": 5, "resources": {"cpuLimit": "4"}},
        "prometheus": {"url": "http://prometheus-operated.monitoring:9090"}}},
    "docs-mirror": _mirror_values(),
}


def _configmap_config(objs: list[Obj]) -> Obj:
    configmaps = [o for o in objs if o["kind"] == "ConfigMap"
                  and "config.yaml" in (o.get("data") or {})]
    assert len(configmaps) == 1
    data: Obj = yaml.safe_load(configmaps[0]["data"]["config.yaml"])
    return data


@pytest.mark.parametrize("values", CASES.values(), ids=list(CASES))
def test_chart_config_is_what_helm_writes(render: Render, values: Obj) -> None:
    written = _configmap_config(render(values))
    mapped, env = chart_config(merge_values([values]))
    assert mapped == written
    assert env == {}
    # And the operator reads it as the same config.
    assert config_from_values(mapped, env) == config_from_values(written, {})


def test_the_cases_are_not_all_alike(render: Render) -> None:
    """The comparison above is only worth something where the chart writes different things:
    every case but the empty epp (which keeps the default) writes its own config."""
    written = {name: json.dumps(_configmap_config(render(v)), sort_keys=True)
               for name, v in CASES.items()}
    assert written.pop("empty-epp-keeps-the-default") == written["defaults"]
    assert len(set(written.values())) == len(written)


def test_several_values_files_merge_as_helm_merges_them(helm: Helm, tmp_path: Path) -> None:
    layers: list[Obj] = [
        {"image": {"registry": "a.example/x", "tag": "0.2.0"},
         "config": {"gatewayPort": 9000, "enginePort": 9001,
                    "probes": {"timeoutSeconds": 5, "startupMarginSeconds": 60}}},
        {"image": {"registry": "b.example/y/"},
         "config": {"gatewayPort": None, "probes": {"timeoutSeconds": 7}}},
    ]
    args = ["template", "glm", str(CHART), "--namespace", "glm-system",
            "--kube-version", KUBE_VERSION]
    for index, layer in enumerate(layers):
        path = tmp_path / f"values-{index}.yaml"
        path.write_text(yaml.safe_dump(layer))
        args += ["--values", str(path)]
    objs = [d for d in yaml.safe_load_all(helm.run(*args).stdout) if d]
    written = _configmap_config(objs)
    assert chart_config(merge_values(layers))[0] == written
    # The control: the later file won, the null removed the key, the maps merged.
    assert written["imageRegistry"] == "b.example/y"
    assert "gatewayPort" not in written
    assert written["probes"] == {"timeoutSeconds": 7, "startupMarginSeconds": 60}
