"""What the operator renders for the endpoint picker, checked against the pinned release's own
source: every flag of both pickers (render/endpoint_picker.py epp_args, pool_epp_args) is one
the release's cmd/epp accepts and has not deprecated, and every key of the EndpointPickerConfig
(endpoint_picker_config) is a field of its config API or of the named plugin's parameters.

The release decodes the config's top level strictly, but each plugin's parameters with a plain
json.Unmarshal: a misspelt or renamed parameter is silently ignored there (v1.5.0 moved the
prefix scorer's `blockSize` to the producer's `blockSizeTokens`, and a config that kept it
would have started on the default). Here it fails.

The source is the toolchain's `inference_extension` component (the `[epp]` pin of
e2e/versions.toml: the picker's Go files, tests left out, under source/), so moving the pin
moves this check with it; the e2e tests run the built binary on the same flags and config.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from glm_operator.config import OperatorConfig
from glm_operator.render.endpoint_picker import (
    endpoint_picker_config,
    epp_args,
    pool_epp_args,
)

from e2e import toolchain

# The struct each rendered plugin's parameters decode into, in the package that defines the
# plugin's type name (its factory's json.Unmarshal target). A plugin rendered without
# parameters needs no entry; one rendered with parameters and no entry fails the test.
PARAMETER_STRUCTS = {
    "metrics-data-source": "metricsDatasourceParams",
    "core-metrics-extractor": "modelServerExtractorParams",
    "approx-prefix-cache-producer": "config",
    "max-score-picker": "pickerParameters",
}
CONFIG_API = "apix/config/v1alpha1/endpointpickerconfig_types.go"
ROOT_TYPE = "EndpointPickerConfig"
# Types from outside the module that the config API embeds inline.
EXTERNAL_INLINE = {"TypeMeta": ("apiVersion", "kind")}  # k8s.io/apimachinery metav1


@pytest.fixture(scope="module")
def source() -> Path:
    if not toolchain.is_cached("inference_extension") and shutil.which("go") is None:
        pytest.skip("the inference_extension component is not cached and there is no Go: "
                    "`python -m e2e.toolchain build inference_extension`")
    return toolchain.ensure("inference_extension") / "source"


# --- reading Go -----------------------------------------------------------------------------


@dataclass(frozen=True)
class GoField:
    json_name: str
    type_name: str  # the element type: pointers and slices stripped
    inline: bool


_STRUCT = re.compile(r"^\s*(?:type\s+)?(\w+)\s+struct\s*\{(.*?)^\s*\}", re.M | re.S)
_FIELD = re.compile(r"^\s*(\w+)?\s*([\w.\[\]*]+)\s+`[^`]*json:\"([^\"]*)\"", re.M)


def go_structs(text: str) -> dict[str, list[GoField]]:
    """Each struct type's JSON fields (`type X struct {...}`, or `X struct {...}` inside a
    `type (...)` block). Comments are dropped first."""
    text = re.sub(r"//[^\n]*", "", text)
    structs: dict[str, list[GoField]] = {}
    for match in _STRUCT.finditer(text):
        fields = []
        for name, go_type, tag in _FIELD.findall(match.group(2)):
            json_name, *options = tag.split(",")
            element = go_type.replace("[]", "").replace("*", "")
            if name and not json_name:  # `Field Type \`json:",inline"\``
                json_name = name
            fields.append(GoField(json_name, element.split(".")[-1], "inline" in options))
        structs[match.group(1)] = fields
    return structs


def package_structs(directory: Path) -> dict[str, list[GoField]]:
    structs: dict[str, list[GoField]] = {}
    for path in sorted(directory.glob("*.go")):
        structs.update(go_structs(path.read_text()))
    return structs


def plugin_package(source: Path, plugin_type: str) -> Path:
    """The package that names the plugin type (`XType = "<type>"`), and that the picker
    registers it (runner.go registerInTreePlugins: `Register(pkg.XType, ...)`)."""
    pattern = re.compile(rf"\b(\w+)\s*=\s*\"{re.escape(plugin_type)}\"")
    found = [(path, match.group(1)) for path in sorted((source / "pkg/epp").rglob("*.go"))
             if (match := pattern.search(path.read_text()))]
    assert len(found) == 1, f"plugin type {plugin_type!r} is defined {len(found)} times: {found}"
    path, constant = found[0]
    runner = (source / "cmd/epp/runner/runner.go").read_text()
    assert re.search(rf"Register\(\w+\.{constant}\b", runner), \
        f"the picker does not register {plugin_type!r} ({constant})"
    return path.parent


def unknown_keys(value: Any, type_name: str, structs: Mapping[str, list[GoField]],
                 where: str) -> Iterator[str]:
    """Every key of `value` (and its nested maps and lists) that the Go type has no JSON
    field for. A field whose type is not a parsed struct (a string, json.RawMessage, a
    Quantity) is not descended into."""
    if isinstance(value, list):
        for index, item in enumerate(value):
            yield from unknown_keys(item, type_name, structs, f"{where}[{index}]")
        return
    if not isinstance(value, Mapping) or type_name not in structs:
        return
    fields = {}
    for field in structs[type_name]:
        if field.inline:
            fields.update({f.json_name: f for f in structs.get(field.type_name, [])})
            fields.update({name: GoField(name, "string", False)
                           for name in EXTERNAL_INLINE.get(field.type_name, ())})
        else:
            fields[field.json_name] = field
    for key, item in value.items():
        if key not in fields:
            yield f"{where}.{key} (not a field of {type_name}: {sorted(fields)})"
        else:
            yield from unknown_keys(item, fields[key].type_name, structs, f"{where}.{key}")


# --- flags ------------------------------------------------------------------------------------

_FLAG = re.compile(r"\bfs\.\w+?VarP?\(\s*&?[\w.]+,\s*\"([\w-]+)\"")
_DEPRECATED = re.compile(r"MarkDeprecated\(\s*\"([\w-]+)\"")


def accepted_flags(source: Path) -> tuple[set[str], set[str]]:
    """The flags cmd/epp defines (server options and logging options) and those it marks
    deprecated."""
    texts = [(source / "pkg/epp/server/options.go").read_text(),
             *(p.read_text() for p in (source / "pkg/common").rglob("options.go"))]
    accepted = {name for text in texts for name in _FLAG.findall(text)}
    deprecated = {name for text in texts for name in _DEPRECATED.findall(text)}
    return accepted, deprecated


def flag_names(args: list[str]) -> list[str]:
    return [a[2:].split("=", 1)[0] for a in args if a.startswith("--")]


def rendered_flags() -> dict[str, list[str]]:
    config = OperatorConfig()
    return {"router's picker": flag_names(epp_args("chat", "models", config)),
            "a pool's picker": flag_names(pool_epp_args("chat-v1", "models"))}


def test_the_flag_reader_sees_the_releases_flags(source: Path) -> None:
    accepted, deprecated = accepted_flags(source)
    # Not vacuous: flags the pickers need, and the metric flags v1.5.0 deprecated.
    assert {"endpoint-selector", "pool-name", "config-file", "grpc-port", "v"} <= accepted
    assert "total-queued-requests-metric" in deprecated


@pytest.mark.parametrize("picker", sorted(rendered_flags()))
def test_every_rendered_flag_is_accepted_and_not_deprecated(source: Path, picker: str) -> None:
    accepted, deprecated = accepted_flags(source)
    flags = rendered_flags()[picker]
    assert flags
    assert [f for f in flags if f not in accepted] == [], f"{picker}: unknown flags"
    assert [f for f in flags if f in deprecated] == [], f"{picker}: deprecated flags"


# --- config -----------------------------------------------------------------------------------


def test_the_config_reader_sees_the_config_api(source: Path) -> None:
    structs = go_structs((source / CONFIG_API).read_text())
    top = {f.json_name for f in structs[ROOT_TYPE]}
    assert {"plugins", "schedulingProfiles", "dataLayer", "flowControl"} <= top
    assert {f.json_name for f in structs["SchedulingPlugin"]} == {"pluginRef", "weight"}
    # ... and a control: a key the API does not have is found.
    bad = {"apiVersion": "x", "plugins": [{"type": "t", "parms": {}}], "dataLayer": {},
           "engineConfigs": []}
    assert [line.split(" (")[0] for line in unknown_keys(bad, ROOT_TYPE, structs, "config")
            ] == ["config.plugins[0].parms", "config.engineConfigs"]


def test_every_key_of_the_rendered_config_is_in_the_config_api(source: Path) -> None:
    structs = go_structs((source / CONFIG_API).read_text())
    config = endpoint_picker_config()
    assert list(unknown_keys(config, ROOT_TYPE, structs, "config")) == []
    assert config["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1"
    group_version = (source / "apix/config/v1alpha1/doc.go").read_text()
    assert "+groupName=inference.networking.x-k8s.io" in group_version
    # Every reference names a plugin that is configured.
    names = {p.get("name", p["type"]) for p in config["plugins"]}
    refs = [p["pluginRef"] for profile in config["schedulingProfiles"]
            for p in profile["plugins"]]
    refs += [s["pluginRef"] for s in config["dataLayer"]["sources"]]
    refs += [e["pluginRef"] for s in config["dataLayer"]["sources"] for e in s["extractors"]]
    assert set(refs) <= names, set(refs) - names


@pytest.mark.parametrize("plugin", [p["type"] for p in endpoint_picker_config()["plugins"]])
def test_every_rendered_plugin_exists_and_its_parameters_are_its_own(
        source: Path, plugin: str) -> None:
    [spec] = [p for p in endpoint_picker_config()["plugins"] if p["type"] == plugin]
    package = plugin_package(source, plugin)
    if "parameters" not in spec:
        return
    assert plugin in PARAMETER_STRUCTS, f"{plugin}: say which struct its parameters decode into"
    structs = package_structs(package)
    struct = PARAMETER_STRUCTS[plugin]
    assert struct in structs, f"{plugin}: no struct {struct} in {package}"
    assert list(unknown_keys(spec["parameters"], struct, structs, plugin)) == []


def test_control_a_misspelt_or_nested_parameter_is_found(source: Path) -> None:
    structs = package_structs(plugin_package(source, "core-metrics-extractor"))
    params = {"defaultEngine": "e", "engineConfigs": [{"name": "e", "kvUsageSpecs": "x"}],
              "engineLabel": "k"}
    assert [line.split(" (")[0] for line in unknown_keys(
        params, PARAMETER_STRUCTS["core-metrics-extractor"], structs, "p")] == [
        "p.engineConfigs[0].kvUsageSpecs", "p.engineLabel"]
