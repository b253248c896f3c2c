"""`glm-operator render`: print the manifests of GLMServices and ModelVersions, offline.

    glm-operator render -f glmservice.yaml -f modelversion.yaml [--config operator.yaml]

Reads every document of every file (`-` is stdin), plans each GLMService against the
ModelVersion it names, and prints the children the operator would apply, as multi-document
YAML, for review or GitOps. Manifests from git have no uid yet, so ownerReferences are
left out; objects read back from a cluster (with metadata.uid) get them.
Exit status 1, with the reason on stderr, when a manifest is invalid, a ModelVersion is
missing, its facts are unknown, or a plan does not fit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pydantic
import yaml

from glm_operator.api.glmservice import GLMService
from glm_operator.api.modelversion import ModelVersion
from glm_operator.config import OperatorConfig, load_config
from glm_operator.planning.from_api import ModelFactsUnknown, plan_request_for
from glm_operator.planning.planner import Plan, plan
from glm_operator.render.modelversion import render_model_version
from glm_operator.render.output import to_yaml
from glm_operator.render.service import Capabilities, ServiceInputs, render_service

GLMSERVICE, MODELVERSION = "GLMService", "ModelVersion"


class RenderCommandError(Exception):
    """A problem with the input the user can fix; printed without a traceback."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", action="append", required=True, type=Path,
                        metavar="FILE", help="YAML file with GLMService and/or ModelVersion "
                        "documents (repeatable; - for stdin)")
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="operator config YAML (images, ports, profiles; "
                        "default $GLM_OPERATOR_CONFIG, else built-in defaults)")
    parser.add_argument("-n", "--namespace", default="default",
                        help="namespace for objects that do not set one (default: default)")
    parser.add_argument("--service-monitor", action="store_true",
                        help="render the ServiceMonitor (as if the Prometheus Operator's CRD "
                        "were installed)")
    parser.add_argument("--keda", action="store_true",
                        help="as if KEDA's ScaledObject CRD were installed: spec.autoscaling "
                        "renders a ScaledObject where its scaler (Auto with prometheus.url in "
                        "--config, or KEDA) chooses KEDA")
    parser.add_argument("--leader-worker-set", action="store_true",
                        help="as if LeaderWorkerSet's CRD were installed: a multi-node service "
                        "(accelerator.nodes > 1) renders a LeaderWorkerSet instead of "
                        "StatefulSets and a headless Service")
    parser.add_argument("--no-model-version-children", action="store_true",
                        help="render only the GLMServices' children (not the cache PVC and "
                        "fetch Job of each ModelVersion)")


def _documents(paths: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for path in paths:
        where = "<stdin>" if str(path) == "-" else str(path)
        try:
            text = sys.stdin.read() if str(path) == "-" else path.read_text()
            docs = list(yaml.safe_load_all(text))
        except OSError as exc:
            raise RenderCommandError(f"{where}: {exc.strerror or exc}") from exc
        except yaml.YAMLError as exc:
            raise RenderCommandError(f"{where}: not valid YAML: {exc}") from exc
        for index, doc in enumerate(docs):
            if doc is None:
                continue
            if not isinstance(doc, dict) or "kind" not in doc:
                raise RenderCommandError(f"{where}: document {index + 1} is not a Kubernetes "
                                         "object (no kind)")
            out.append((f"{where} document {index + 1}", doc))
    return out


def _validated(model: type[GLMService] | type[ModelVersion], where: str,
               doc: dict[str, Any], namespace: str) -> Any:
    doc = {**doc, "metadata": {"namespace": namespace, **(doc.get("metadata") or {})}}
    try:
        obj = model.model_validate(doc)
    except pydantic.ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        message = f"{where}: invalid {model.__name__}:\n" + "\n".join(lines)
        raise RenderCommandError(message) from exc
    if not obj.metadata.name:
        raise RenderCommandError(f"{where}: {model.__name__} has no metadata.name")
    return obj


def _plan(request_plan: Plan, what: str) -> Plan:
    if request_plan.feasible:
        return request_plan
    nearest = "; ".join(a.describe() for a in request_plan.alternatives) or "none found"
    raise RenderCommandError(f"{what} does not fit: {request_plan.reason}. Nearest: {nearest}")


def render_documents(
    docs: list[tuple[str, dict[str, Any]]],
    config: OperatorConfig,
    *,
    namespace: str,
    capabilities: Capabilities,
    model_version_children: bool = True,
) -> list[dict[str, Any]]:
    services: list[GLMService] = []
    versions: dict[tuple[str, str], ModelVersion] = {}
    for where, doc in docs:
        kind = doc.get("kind")
        if kind == GLMSERVICE:
            services.append(_validated(GLMService, where, doc, namespace))
        elif kind == MODELVERSION:
            mv = _validated(ModelVersion, where, doc, namespace)
            versions[(mv.metadata.namespace, mv.metadata.name)] = mv
        else:
            raise RenderCommandError(f"{where}: kind {kind!r} is neither GLMService nor "
                                     "ModelVersion")
    if not services and not versions:
        raise RenderCommandError("no GLMService or ModelVersion in the input")
    objects: list[dict[str, Any]] = []
    if model_version_children:
        for mv in versions.values():
            objects += render_model_version(mv, config,
                                            with_owner_references=bool(mv.metadata.uid))
    for svc in services:
        name, ns = svc.metadata.name, svc.metadata.namespace
        mv_name = svc.spec.model_version
        mv = versions.get((ns or namespace, mv_name))
        if mv is None:
            raise RenderCommandError(
                f"GLMService {name}: spec.modelVersion {mv_name!r} is not among the inputs: "
                f"pass its ModelVersion with another -f (namespace {ns})")
        try:
            main = _plan(plan(plan_request_for(svc, mv), config.profiles),
                         f"GLMService {name} (main pool)")
            long_plan = None
            if svc.spec.long_context is not None and svc.spec.long_context.enabled:
                long_plan = _plan(
                    plan(plan_request_for(svc, mv, long_context=True), config.profiles),
                    f"GLMService {name} (long-context pool)")
        except ModelFactsUnknown as exc:
            raise RenderCommandError(str(exc)) from exc
        except ValueError as exc:  # unknown profile, unplannable request
            raise RenderCommandError(f"GLMService {name}: {exc}") from exc
        objects += render_service(ServiceInputs(
            service=svc, model_version=mv, plan=main, long_context_plan=long_plan,
            config=config, capabilities=capabilities,
            with_owner_references=bool(svc.metadata.uid)))
    return objects


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"glm-operator render: operator config: {exc}", file=sys.stderr)
        return 1
    try:
        objects = render_documents(
            _documents(args.filename), config, namespace=args.namespace,
            capabilities=Capabilities(service_monitor=args.service_monitor, keda=args.keda,
                                      leader_worker_set=args.leader_worker_set),
            model_version_children=not args.no_model_version_children,
        )
    except (RenderCommandError, ValueError) as exc:
        print(f"glm-operator render: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(to_yaml(objects))
    return 0
