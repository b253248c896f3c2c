"""`glm-operator images`: the mirror list, with and without -f, from chart values or operator
config; the mirror values of docs/install.md leave no image outside the mirror, and every
image the renderer writes for the examples is on the list the command prints without -f."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from glm_operator.cli import main
from glm_operator.config import OperatorConfig
from glm_operator.images import (
    chart_config,
    config_from_values,
    configured_images,
    merge_values,
    rendered_images,
)
from glm_operator.planning.accelerators import (
    VLLM_ASCEND_IMAGE,
    VLLM_CUDA_IMAGE,
    builtin_profiles,
    runtime_images,
)
from glm_operator.render.inference_pool import INFERENCE_GATEWAY_CRDS
from glm_operator.render.service import Capabilities
from glm_operator.render_command import render_documents
from glm_operator.wellknown import API_VERSION
from render.cases import MODEL_VERSIONS, MULTI_NODE_CASES, service_manifest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
EXAMPLE_DIRS = sorted(p.parent for p in EXAMPLES.rglob("glmservice.yaml"))
INSTALL_MD = REPO / "docs" / "install.md"
MIRROR = "mirror.example/glm"


def images_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["images", *argv]) == 0, capsys.readouterr().err
    return capsys.readouterr().out.splitlines()


def failure(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["images", *argv]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "Traceback" not in captured.err
    return captured.err


def mirror_values() -> dict[str, Any]:
    """The helm values of docs/install.md's mirror section (the page's one yaml block)."""
    section = INSTALL_MD.read_text().split("## Mirrors and air-gapped clusters", 1)[1]
    section = section.split("\n## ", 1)[0]
    blocks = re.findall(r"^```yaml\n(.*?)^```$", section, flags=re.S | re.M)
    assert len(blocks) == 1, "the mirror section has one values block"
    values: dict[str, Any] = yaml.safe_load(blocks[0])
    return values


def write(tmp_path: Path, name: str, data: Any) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def example_docs(folder: Path) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{path.name}#{i}", doc) for path in sorted(folder.glob("*.yaml"))
            for i, doc in enumerate(yaml.safe_load_all(path.read_text())) if doc]


def with_routing(folder: Path, routing: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    docs = copy.deepcopy(example_docs(folder))
    for _, doc in docs:
        if doc["kind"] == "GLMService":
            doc["spec"]["routing"] = routing
    return docs


def llamacpp_group_docs() -> list[tuple[str, dict[str, Any]]]:
    """A llama.cpp group of three nodes per replica: its leader waits for the workers in an
    init container (no example in examples/ has one)."""
    engine, key, profile, count, nodes, extra = MULTI_NODE_CASES["llamacpp-a10x4x3"]
    svc = service_manifest(engine, "a10", **extra)
    svc["metadata"] = {"name": "glm-46"}
    svc["spec"]["modelVersion"] = MODEL_VERSIONS[key]["name"]
    svc["spec"]["accelerator"] = {"profile": profile, "count": count, "nodes": nodes}
    mv = {"apiVersion": API_VERSION, "kind": "ModelVersion",
          "metadata": {"name": MODEL_VERSIONS[key]["name"]}, "spec": MODEL_VERSIONS[key]["spec"]}
    return [("svc", svc), ("mv", mv)]


ROUTED = EXAMPLES / "nvidia-a100-80gb-vllm-tp2"  # two replicas: where a picker pays
ROUTINGS = {
    "EndpointPicker": {"mode": "EndpointPicker"},
    "InferenceGateway": {"mode": "InferenceGateway", "gatewayRef": {"name": "inference"}},
}


def every_rendering(config: OperatorConfig) -> dict[str, set[str]]:
    """The images the renderers write for each example, and for one in each routing mode."""
    capabilities = Capabilities(inference_crds=frozenset(INFERENCE_GATEWAY_CRDS))
    cases = {folder.name: example_docs(folder) for folder in EXAMPLE_DIRS}
    cases.update({f"{ROUTED.name}+{mode}": with_routing(ROUTED, routing)
                  for mode, routing in ROUTINGS.items()})
    cases["llamacpp-group"] = llamacpp_group_docs()
    return {name: set(rendered_images(render_documents(docs, config, namespace="examples",
                                                       capabilities=capabilities)))
            for name, docs in cases.items()}


# ----------------------------------------------------------------------- without -f


def test_default_lists_the_operator_picker_and_every_engine_image(
        capsys: pytest.CaptureFixture[str]) -> None:
    config = OperatorConfig()
    listed = images_of([], capsys)
    assert listed == sorted(set(listed))  # sorted, unique, one per line
    assert set(listed) == {config.operator_image, config.epp_image, VLLM_CUDA_IMAGE,
                           VLLM_ASCEND_IMAGE, *runtime_images().values()}


def test_the_list_holds_every_image_the_renderer_writes() -> None:
    """The inventory cannot miss an image the renderer uses: every example, each routing
    mode (their picker), multi-node groups (the wait-tcp init container)."""
    config = OperatorConfig()
    listed = set(configured_images(config))
    rendered = every_rendering(config)
    assert rendered[f"{ROUTED.name}+EndpointPicker"] >= {config.epp_image,
                                                          config.operator_image}
    assert config.epp_image in rendered[f"{ROUTED.name}+InferenceGateway"]
    assert config.epp_image not in rendered[ROUTED.name]  # mode Service: no picker
    missing = {name: images - listed for name, images in rendered.items() if images - listed}
    assert missing == {}


def test_a_profile_added_in_operator_config_is_listed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    own = "registry.example/llama-cuda12:b4000"
    config = write(tmp_path, "operator.yaml", {"acceleratorProfiles": {
        "nvidia-v100-llamacpp": {"basedOn": "nvidia-v100-32gb", "engines": ["llamacpp"],
                                 "images": {"llamacpp": own}}}})
    assert own in images_of(["--config", config], capsys)
    assert own not in images_of([], capsys)  # control


def test_json_says_where_each_image_is_used(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["images", "-o", "json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    by_image = {e["image"]: e["usedBy"] for e in entries}
    assert [e["image"] for e in entries] == sorted(by_image)
    assert "llamacpp engine, profile cpu" in by_image[runtime_images()["llamacpp-cpu"]]
    assert "fetch Job" in by_image[OperatorConfig().operator_image]


def test_json_gives_each_images_platforms(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    def platforms(argv: list[str]) -> dict[str, Any]:
        assert main(["images", "-o", "json", *argv]) == 0
        return {e["image"]: e["platforms"] for e in json.loads(capsys.readouterr().out)}

    both = ["linux/amd64", "linux/arm64"]
    found = platforms([])
    images = runtime_images()
    assert found[images["llamacpp-cann"]] == ["linux/arm64"]
    assert found[images["llamacpp-cuda"]] == ["linux/amd64"]
    assert found[images["llamacpp-cpu"]] == both
    assert found[OperatorConfig().operator_image] == both
    assert found[VLLM_ASCEND_IMAGE] == both
    # operator config imageArchitectures narrows one; an image it does not know is null
    own = "registry.example.com/own/llama-server:1"
    config = write(tmp_path, "operator.yaml", {
        "imageArchitectures": {"quay.io/ascend/vllm-ascend": ["arm64"]},
        "acceleratorProfiles": {"own-cpu": {"basedOn": "cpu", "images": {"llamacpp": own}}}})
    narrowed = platforms(["--config", config])
    assert narrowed[VLLM_ASCEND_IMAGE] == ["linux/arm64"]
    assert narrowed[own] is None
    assert narrowed[images["llamacpp-cann"]] == ["linux/arm64"]


# ----------------------------------------------------------------------- the mirror


def outside(images: list[str] | set[str]) -> set[str]:
    return {image for image in images if not image.startswith(f"{MIRROR}/")}


def test_the_documented_mirror_values_list_only_mirrored_images(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = mirror_values()
    listed = images_of(["--values", write(tmp_path, "values.yaml", values)], capsys)
    assert outside(listed) == set()
    # The control: the registry alone leaves upstream's vLLM images where they are.
    registry_only = write(tmp_path, "registry.yaml", {"image": {"registry": MIRROR}})
    assert outside(images_of(["--values", registry_only], capsys)) == {
        VLLM_CUDA_IMAGE, VLLM_ASCEND_IMAGE}


def test_the_documented_mirror_values_override_every_profile_that_runs_upstream() -> None:
    """A built-in profile added later (with an upstream image) fails here until the docs
    override it too."""
    upstream = {name for name, profile in builtin_profiles(MIRROR).items()
                if outside(set(profile.images.values()))}
    assert upstream <= set(mirror_values()["config"]["acceleratorProfiles"])


def test_with_the_mirror_config_nothing_renders_outside_the_mirror() -> None:
    mirrored = config_from_values(*chart_config(mirror_values()))
    leaks = {name: outside(images) for name, images in every_rendering(mirrored).items()}
    assert {name: images for name, images in leaks.items() if images} == {}
    # The control: without the profile overrides the vLLM examples pull from upstream.
    registry_only = config_from_values(*chart_config({"image": {"registry": MIRROR}}))
    leaks = {name: outside(images) for name, images in every_rendering(registry_only).items()}
    assert leaks["nvidia-h200-glm5-vllm"] == {VLLM_CUDA_IMAGE}
    assert leaks["ascend-910b-vllm"] == {VLLM_ASCEND_IMAGE}
    assert leaks["cpu-llamacpp"] == set()


def test_an_upstream_picker_is_listed_where_image_epp_names_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    upstream = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
    values = merge_values([mirror_values(), {"image": {"epp": upstream}}])
    assert outside(images_of(["--values", write(tmp_path, "v.yaml", values)], capsys)) == {
        upstream}


# ----------------------------------------------------------------------- with -f


@pytest.mark.parametrize("folder", EXAMPLE_DIRS, ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_every_example_passes_through_images_f(
        folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = OperatorConfig()
    from_dir = images_of(["-f", str(folder)], capsys)
    files = [arg for path in sorted(folder.glob("*.yaml")) for arg in ("-f", str(path))]
    assert images_of(files, capsys) == from_dir  # a directory is its *.yaml files
    assert config.operator_image in from_dir
    assert len(from_dir) >= 2  # the operator's and an engine's
    assert set(from_dir) <= set(configured_images(config))


def test_f_lists_only_what_the_services_render(capsys: pytest.CaptureFixture[str]) -> None:
    listed = images_of(["-f", str(EXAMPLES / "cpu-llamacpp")], capsys)
    assert listed == sorted([OperatorConfig().operator_image,
                             runtime_images()["llamacpp-cpu"]])


def test_f_follows_the_config_and_a_services_own_image(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = copy.deepcopy(example_docs(EXAMPLES / "cpu-llamacpp"))
    own = "registry.example/team/llama-server:b5000"
    for _, doc in docs:
        if doc["kind"] == "GLMService":
            doc["spec"]["podOverrides"] = {"image": own}
    manifest = tmp_path / "svc.yaml"
    manifest.write_text(yaml.safe_dump_all([doc for _, doc in docs]))
    values = write(tmp_path, "values.yaml", {"image": {"registry": MIRROR, "tag": "0.2.0"}})
    assert images_of(["--values", values, "-f", str(manifest)], capsys) == sorted(
        [f"{MIRROR}/glm-operator:0.2.0", own])


@pytest.mark.parametrize("mode", sorted(ROUTINGS))
def test_f_lists_the_picker_of_each_routing_mode(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str) -> None:
    manifest = tmp_path / "routed.yaml"
    manifest.write_text(yaml.safe_dump_all(
        [doc for _, doc in with_routing(ROUTED, ROUTINGS[mode])]))
    config = OperatorConfig()
    assert config.epp_image in images_of(["-f", str(manifest)], capsys)
    assert config.epp_image not in images_of(["-f", str(ROUTED)], capsys)  # control: Service


def test_init_containers_are_listed(tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "group.yaml"
    manifest.write_text(yaml.safe_dump_all([doc for _, doc in llamacpp_group_docs()]))
    assert main(["images", "-o", "json", "-f", str(manifest)]) == 0
    entries = json.loads(capsys.readouterr().out)
    by_image = {e["image"]: e["usedBy"] for e in entries}
    assert any(where.endswith("init container wait") or "init container" in where
               for where in by_image[OperatorConfig().operator_image]), by_image


def test_other_kinds_are_skipped_but_a_misspelt_kind_of_ours_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "keys"}}
    docs = [doc for _, doc in example_docs(EXAMPLES / "cpu-llamacpp")]
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(yaml.safe_dump_all([secret, *docs]))
    assert len(images_of(["-f", str(mixed)], capsys)) == 2
    typo = {**docs[0], "kind": "GLMServce"}
    bad = tmp_path / "typo.yaml"
    bad.write_text(yaml.safe_dump_all([typo]))
    assert "'GLMServce'" in failure(["-f", str(bad)], capsys)
    only_secret = write(tmp_path, "secret.yaml", secret)
    assert "no GLMService or ModelVersion in" in failure(["-f", only_secret], capsys)


# ----------------------------------------------------------------------- values and errors


def test_values_files_merge_as_helm_merges_them() -> None:
    merged = merge_values([
        {"image": {"registry": "a.example", "tag": "0.2.0"}, "config": {"gatewayPort": 9000}},
        {"image": {"registry": "b.example/"}, "config": {"gatewayPort": None}},
    ])
    assert merged == {"image": {"registry": "b.example/", "tag": "0.2.0"}, "config": {}}
    config, env = chart_config(merged)
    assert config == {"imageRegistry": "b.example", "imageTag": "0.2.0"}
    assert env == {}


def test_extra_env_overrides_reach_the_config() -> None:
    values = {"image": {"registry": MIRROR},
              "extraEnv": [{"name": "GLM_OPERATOR_IMAGE_REGISTRY", "value": "env.example/x"},
                           {"name": "OTHER", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]}
    config = config_from_values(*chart_config(values))
    assert config.operator_image.startswith("env.example/x/")
    assert config_from_values(*chart_config({"image": {"registry": MIRROR}})
                              ).operator_image.startswith(f"{MIRROR}/")  # control


@pytest.mark.parametrize(("values", "expected"), [
    ({"config": {"gatewayPort": "x"}}, "config.gatewayPort"),
    ({"config": {"gatewayPorts": 1}}, "config.gatewayPorts"),
    ({"image": {"tag": "latest"}}, "image.tag"),
    ({"image": {"epp": "registry.example/epp"}}, "image.epp"),
    ({"image": "ghcr.io"}, "image must be a mapping"),
    ({"config": {"acceleratorProfiles": {"nvidia-a10": {"images": {"vllm": "x/y:latest"}}}}},
     "profile nvidia-a10"),
    ({"extraEnv": {"GLM_OPERATOR_IMAGE_TAG": "1"}}, "extraEnv must be a list"),
])
def test_bad_values_name_the_file_and_the_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], values: dict[str, Any],
        expected: str) -> None:
    path = write(tmp_path, "my-values.yaml", values)
    err = failure(["--values", path], capsys)
    assert f"--values {path}" in err
    assert expected in err


def test_bad_files_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "missing.yaml")
    assert f"{missing}: No such file" in failure(["--values", missing], capsys)
    assert f"operator config {missing}: No such file" in failure(["--config", missing], capsys)
    assert f"{missing}: No such file" in failure(["-f", missing], capsys)
    not_yaml = tmp_path / "broken.yaml"
    not_yaml.write_text("a: [\n")
    assert f"{not_yaml}: not valid YAML" in failure(["--values", str(not_yaml)], capsys)
    config = write(tmp_path, "operator.yaml", {"gatewayPort": "x"})
    assert f"operator config {config}: invalid:\n  gatewayPort" in failure(
        ["--config", config], capsys)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "a directory without *.yaml files" in failure(["-f", str(empty)], capsys)


# ------------------------------------------------------------ pull secrets of a private mirror


def _pod_specs(node: Any) -> list[dict[str, Any]]:
    """Every pod spec in an object, however deep (Deployments, Jobs, group templates)."""
    if isinstance(node, dict):
        found = [node] if "containers" in node else []
        return found + [spec for value in node.values() for spec in _pod_specs(value)]
    if isinstance(node, list):
        return [spec for value in node for spec in _pod_specs(value)]
    return []


def every_pod_spec(config: OperatorConfig) -> list[dict[str, Any]]:
    capabilities = Capabilities(inference_crds=frozenset(INFERENCE_GATEWAY_CRDS))
    cases = [example_docs(folder) for folder in EXAMPLE_DIRS]
    cases += [with_routing(ROUTED, routing) for routing in ROUTINGS.values()]
    cases.append(llamacpp_group_docs())
    return [spec for docs in cases
            for obj in render_documents(docs, config, namespace="examples",
                                        capabilities=capabilities)
            for spec in _pod_specs(obj)]


def test_the_mirrors_pull_secrets_reach_every_pod_the_operator_renders() -> None:
    config = OperatorConfig(imagePullSecrets=["mirror-pull", "backup-pull"])
    specs = every_pod_spec(config)
    # engines, gateways, routers, pickers, fetch Jobs, a group's workers
    assert len(specs) > 20
    assert all(s.get("imagePullSecrets") == [{"name": "mirror-pull"}, {"name": "backup-pull"}]
               for s in specs), [s["containers"][0]["name"] for s in specs
                                 if "imagePullSecrets" not in s]
    # Control: none without the setting.
    assert not any("imagePullSecrets" in s for s in every_pod_spec(OperatorConfig()))


@pytest.mark.parametrize("names", [["Mirror"], ["a", "a"], ["x" * 254], ["-bad"]])
def test_a_pull_secret_that_cannot_be_a_secret_name_is_refused(names: list[str]) -> None:
    with pytest.raises(ValueError, match="imagePullSecrets"):
        OperatorConfig(imagePullSecrets=names)
