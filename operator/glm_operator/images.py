"""`glm-operator images`: every image the operator may run, for a registry mirror.

    glm-operator images [--values values.yaml ... | --config operator.yaml]
                        [-f glmservice.yaml -f modelversion.yaml | -f examples/cpu-llamacpp]

Without -f: every image the configuration can render at all: the operator's own (the
operator, the gateway sidecar, the router and the fetch Job run it), the endpoint picker of
spec.routing.mode EndpointPicker and InferenceGateway, and the engine images of every
accelerator profile (operator-config acceleratorProfiles included). With -f: the images of
what those GLMServices and ModelVersions render, read from the renderers' own output (so the
list cannot drift from them), plus the operator's; InferenceGateway's pickers, which
`glm-operator render` leaves to the controller, come from the controller's builder.

`--values` reads the helm chart's values the way charts/glm-operator maps them to the
operator config (`chart_config`, held to `helm template` by tests/chart/test_images_values.py).
One image per line, sorted and unique, for `| xargs -n1 ...`; `--output json` says where each
is used and which platforms it has builds for (`platforms`, null where the operator's table,
planning/architectures.py with imageArchitectures over it, does not know the image). A command
that wires config and render, so it lives above both.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pydantic
import yaml
from pydantic.alias_generators import to_camel

from glm_operator import __version__
from glm_operator.config import (
    CONFIG_FILE_ENV,
    ENV_OVERRIDES,
    NESTED_ENV_OVERRIDES,
    OperatorConfig,
    load_config,
)
from glm_operator.planning.accelerators import DEFAULT_IMAGE_REGISTRY
from glm_operator.planning.architectures import ImageArchitectures, image_architectures, platforms
from glm_operator.render.capabilities import capabilities_of
from glm_operator.render.inference_pool import INFERENCE_GATEWAY_CRDS
from glm_operator.render_command import (
    GLMSERVICE,
    MODELVERSION,
    RenderCommandError,
    render_documents,
)
from glm_operator.render_command import _documents as read_documents
from glm_operator.wellknown import GROUP

# image -> where it is used (human words), the JSON output's "usedBy".
Uses = dict[str, list[str]]

OPERATOR_USES = ("the operator", "gateway sidecar", "router (spec.routing.mode EndpointPicker)",
                 "fetch Job", "llama.cpp group leader init (wait-tcp)")
EPP_USE = "endpoint picker (spec.routing.mode EndpointPicker, InferenceGateway)"
# Operator-config fields whose chart value is not `config.<field>` (templates/_helpers.tpl).
CHART_KEYS = {"imageRegistry": "image.registry", "imageTag": "image.tag",
              "eppImage": "image.epp"}


class ImagesCommandError(Exception):
    """A problem with the input the user can fix; printed without a traceback."""


# ------------------------------------------------------------------- chart values -> config


def merge_values(layers: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """helm's coalescing of `--values` files: maps merge key by key, a later file wins, and a
    null deletes the key (so the chart's default stands)."""
    merged: dict[str, Any] = {}
    for layer in layers:
        _merge_into(merged, layer)
    return merged


def _merge_into(into: dict[str, Any], layer: Mapping[str, Any]) -> None:
    for key, value in layer.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge_into(into[key], value)
        elif isinstance(value, Mapping):
            into[key] = {}
            _merge_into(into[key], value)
        else:
            into[key] = value


def chart_config(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The operator config the chart writes to its ConfigMap for these (merged) values, and
    the environment `extraEnv` gives the operator (its GLM_OPERATOR_* overrides win).

    Mirrors `glm-operator.config` in templates/_helpers.tpl: imageRegistry (trailing `/`
    trimmed), imageTag (empty: the chart's appVersion, which is the package version), eppImage
    only when image.epp is set, then every config key that is set (an empty map keeps the
    default)."""
    image = _section(values, "image")
    registry = image.get("registry", DEFAULT_IMAGE_REGISTRY)
    tag = image.get("tag") or __version__
    for key, value in (("image.registry", registry), ("image.tag", tag),
                       ("image.epp", image.get("epp", ""))):
        if not isinstance(value, str):
            raise ImagesCommandError(f"{key} must be a string, not {value!r}")
    config: dict[str, Any] = {"imageRegistry": registry.removesuffix("/"), "imageTag": tag}
    if image.get("epp"):
        config["eppImage"] = image["epp"]
    for key, value in _section(values, "config").items():
        if not (value is None or (isinstance(value, Mapping) and not value)):
            config[key] = value
    return config, _extra_env(values.get("extraEnv"))


def _section(values: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    section = values.get(key) or {}
    if not isinstance(section, Mapping):
        raise ImagesCommandError(f"{key} must be a mapping, not {section!r}")
    return section


def _extra_env(extra: Any) -> dict[str, str]:
    """The plain `value`s of extraEnv (a valueFrom cannot be known offline)."""
    if extra is None:
        return {}
    if not isinstance(extra, list):
        raise ImagesCommandError(f"extraEnv must be a list of env vars, not {extra!r}")
    env: dict[str, str] = {}
    for index, item in enumerate(extra):
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise ImagesCommandError(f"extraEnv[{index}] must be an env var with a name")
        if isinstance(item.get("value"), str):
            env[item["name"]] = item["value"]
    return env


def config_from_values(config: Mapping[str, Any], env: Mapping[str, str]) -> OperatorConfig:
    """The OperatorConfig the installed operator reads: the ConfigMap's config.yaml, then the
    environment overrides load_config applies (config.py's ENV_OVERRIDES)."""
    data: dict[str, Any] = json.loads(json.dumps(config))  # a deep copy we may change
    for variable, field in ENV_OVERRIDES.items():
        if env.get(variable):
            data[to_camel(field)] = env[variable]
    for variable, (section, field) in NESTED_ENV_OVERRIDES.items():
        if env.get(variable):
            data.setdefault(section, {})[to_camel(field)] = (
                env[variable])
    try:
        return OperatorConfig.model_validate(data)
    except pydantic.ValidationError as exc:
        lines = [f"  {_values_error(error['loc'], error['msg'])}" for error in exc.errors()]
        raise ImagesCommandError("invalid operator config:\n" + "\n".join(lines)) from exc
    except ValueError as exc:  # model_post_init: profiles, pinned images, ports
        raise ImagesCommandError(f"invalid operator config: {exc}") from exc


def _values_error(loc: Sequence[int | str], message: str) -> str:
    """A config error as the chart value it is about: `config.gatewayPort: ...`,
    `image.tag: ...`. A rule across fields (the profiles, two equal ports, the picker's
    pinned tag) has no location; its message names the profile or the fields."""
    parts = [str(part) for part in loc]
    if not parts:
        return message.replace("operator config eppImage", CHART_KEYS["eppImage"])
    if parts[0] in CHART_KEYS:
        return ".".join([CHART_KEYS[parts[0]], *parts[1:]]) + f": {message}"
    return ".".join(["config", *parts]) + f": {message}"


def _read_values(paths: list[Path]) -> dict[str, Any]:
    layers = []
    for path in paths:
        try:
            loaded = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise ImagesCommandError(f"{path}: {exc.strerror or exc}") from exc
        except yaml.YAMLError as exc:
            raise ImagesCommandError(f"{path}: not valid YAML: {exc}") from exc
        if loaded is None:
            continue
        if not isinstance(loaded, dict):
            raise ImagesCommandError(f"{path}: chart values must be a mapping")
        layers.append(loaded)
    return merge_values(layers)


# ----------------------------------------------------------------------------- the images


def configured_images(config: OperatorConfig) -> Uses:
    """Every image this configuration can render, whatever the GLMServices say (an engine
    image a GLMService sets itself, spec.podOverrides.image, is only known with -f)."""
    uses: Uses = {config.operator_image: list(OPERATOR_USES)}
    uses.setdefault(config.epp_image, []).append(EPP_USE)
    for name, profile in sorted(config.profiles.items()):
        for engine in profile.engines:
            uses.setdefault(profile.images[engine], []).append(
                f"{engine} engine, profile {name}")
    return uses


def _containers(obj: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every container and initContainer of every pod template in a rendered object, found
    by walking it: a kind the renderer learns later (a LeaderWorkerSet's two templates, a
    Job's) needs no change here."""
    if isinstance(obj, dict):
        for key in ("containers", "initContainers"):
            for container in obj.get(key) or []:
                if isinstance(container, dict) and "image" in container:
                    yield key, container
        for value in obj.values():
            yield from _containers(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from _containers(item)


def rendered_images(objects: Iterable[Mapping[str, Any]]) -> Uses:
    uses: Uses = {}
    for obj in objects:
        meta = obj.get("metadata") or {}
        where = f"{obj.get('kind')} {meta.get('namespace')}/{meta.get('name')}"
        for key, container in _containers(dict(obj)):
            kind = "init container" if key == "initContainers" else "container"
            uses.setdefault(str(container["image"]), []).append(
                f"{where} {kind} {container.get('name')}")
    return uses


def _ours(doc: Mapping[str, Any]) -> bool:
    """A GLMService or ModelVersion, or a misspelt kind of our group (which render refuses
    by name rather than this command skipping it)."""
    api_version = str(doc.get("apiVersion") or "")
    return (doc.get("kind") in (GLMSERVICE, MODELVERSION)
            or api_version.split("/")[0] == GROUP)


def images_of_manifests(paths: list[Path], config: OperatorConfig, *,
                        namespace: str) -> Uses:
    """What these GLMServices and ModelVersions render, plus the operator itself. A
    directory stands for its *.yaml files (as `kubectl apply -f DIR`); objects of other API
    groups (a Namespace, a Secret, an Argo CD Application) render nothing of ours and are
    skipped."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted([*path.glob("*.yaml"), *path.glob("*.yml")])
            if not found:
                raise ImagesCommandError(f"{path}: a directory without *.yaml files")
            files += found
        else:
            files.append(path)
    docs = [(where, doc) for where, doc in read_documents(files) if _ours(doc)]
    if not docs:
        raise ImagesCommandError(
            f"no GLMService or ModelVersion in {', '.join(str(p) for p in paths)}")
    # With the inference gateway's CRDs, so that its pickers (images to mirror) are rendered.
    objects = render_documents(docs, config, namespace=namespace,
                               capabilities=capabilities_of(INFERENCE_GATEWAY_CRDS))
    uses: Uses = {config.operator_image: ["the operator"]}
    for image, where in rendered_images(objects).items():
        uses.setdefault(image, []).extend(where)
    return uses


# ----------------------------------------------------------------------------- the command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--values", action="append", type=Path, metavar="FILE",
                        help="helm values of charts/glm-operator (repeatable; a later file "
                        "wins, as with helm): the operator config the chart would write")
    source.add_argument("--config", type=Path, metavar="FILE",
                        help="operator config YAML (default $GLM_OPERATOR_CONFIG, else "
                        "built-in defaults)")
    parser.add_argument("-f", "--filename", action="append", type=Path, metavar="FILE",
                        help="GLMService and ModelVersion YAML, or a directory of it "
                        "(repeatable; - for stdin): only the images those render")
    parser.add_argument("-n", "--namespace", default="default",
                        help="namespace for objects that do not set one (default: default)")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text",
                        help="text: one image per line, sorted (default); json: each image "
                        "with where it is used")


def _config(args: argparse.Namespace) -> OperatorConfig:
    if args.values:
        values = _read_values(args.values)  # its errors name the file
        try:
            return config_from_values(*chart_config(values))
        except ImagesCommandError as exc:
            where = ", ".join(str(p) for p in args.values)
            raise ImagesCommandError(f"--values {where}: {exc}") from exc
    where = str(args.config or os.environ.get(CONFIG_FILE_ENV) or "built-in defaults")
    try:
        return load_config(args.config)
    except pydantic.ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in e['loc']) or '(config)'}: {e['msg']}"
                 for e in exc.errors()]
        raise ImagesCommandError(f"operator config {where}: invalid:\n"
                                 + "\n".join(lines)) from exc
    except OSError as exc:
        raise ImagesCommandError(f"operator config {where}: {exc.strerror or exc}") from exc
    except (ValueError, yaml.YAMLError) as exc:
        raise ImagesCommandError(f"operator config {where}: {exc}") from exc


def _platforms(image: str, table: ImageArchitectures | None) -> list[str] | None:
    architectures = image_architectures(image, table or {})
    return None if architectures is None else list(platforms(architectures))


def format_uses(uses: Uses, output: str, table: ImageArchitectures | None = None) -> str:
    """`table`: image repository -> architectures (the config's image_architecture_table),
    for the JSON's `platforms` (a mirror copies those)."""
    images = sorted(uses)
    if output == "json":
        return json.dumps([{"image": image, "usedBy": uses[image],
                            "platforms": _platforms(image, table)} for image in images],
                          indent=2) + "\n"
    return "".join(f"{image}\n" for image in images)


def run(args: argparse.Namespace) -> int:
    try:
        config = _config(args)
        uses = (images_of_manifests(args.filename, config, namespace=args.namespace)
                if args.filename else configured_images(config))
    except (ImagesCommandError, RenderCommandError, ValueError) as exc:
        print(f"glm-operator images: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(format_uses(uses, args.output, config.image_architecture_table))
    return 0
