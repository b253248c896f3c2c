"""`glm-operator render`: print every object the operator would create, offline.

    glm-operator render -f glmservice.yaml -f modelversion.yaml [--config operator.yaml]
        [--cluster-has istio,servicemonitor,keda,lws,inference-extension,gateway-api]
        [--api-resources FILE]

Reads every document of every file (`-` is stdin) and prints, as multi-document YAML, the
children the operator would apply: those of each ModelVersion (cache PVC, fetch Job and its
RBAC) and those of each GLMService, mesh routes and inference-gateway objects included. It
does not assemble them itself: it calls the controllers' own pure decisions
(decide/model_version.py, decide/service.py) with what a reconcile would observe in a
cluster serving the optional CRDs named (none unless told): a `ServiceObservation` with no
live children yet, nothing else read, and each ModelVersion as the fetch Job leaves it
(Ready, unless the input carries a status of its own, as one read back from a cluster
does). So render and the operator cannot drift apart; e2e/test_render_matches_operator.py
holds them equal.

Manifests from git have no uid yet, so ownerReferences are left out; objects read back from
a cluster (with metadata.uid) get them. Exit status 1, with the reason on stderr, when a
manifest is invalid, a ModelVersion is missing, or the operator would not serve a service
(its facts are unknown, its plan does not fit: the Planned or ModelReady condition's words).

Wires decide/ and render/ together, so it lives above both (tests/test_layering.py).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pydantic
import yaml

from glm_operator.api import GLMServiceConditionType
from glm_operator.api.glmservice import GLMService
from glm_operator.api.modelversion import ModelVersion
from glm_operator.config import OperatorConfig, load_config
from glm_operator.decide.model_version import decide_model_version
from glm_operator.decide.observed import ServiceObservation
from glm_operator.decide.service import ServiceDecision, decide_service
from glm_operator.render.capabilities import CRD_SETS, OPTIONAL_CRDS, capabilities_of
from glm_operator.render.output import to_yaml
from glm_operator.render.service import Capabilities

GLMSERVICE, MODELVERSION = "GLMService", "ModelVersion"
Obj = dict[str, Any]
# Stands in for the uid of an owner read from git: the decisions set ownerReferences, and
# those pointing at it are taken out again.
OFFLINE_UID = "00000000-0000-0000-0000-render-offline"
# Conditions whose False means the operator would not serve the wanted version.
NOT_SERVED = (GLMServiceConditionType.PLANNED, GLMServiceConditionType.MODEL_READY)
# Conditions worth a note on stderr when False: something the output lacks and why.
NOTED = (GLMServiceConditionType.GATEWAY_ACCEPTED, GLMServiceConditionType.AUTOSCALING,
         GLMServiceConditionType.TRAFFIC_SPLIT)


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
    parser.add_argument("--cluster-has", action="append", default=[], metavar="NAMES",
                        help="the optional CRDs the target cluster serves, comma-separated "
                        f"(repeatable): {', '.join(CRD_SETS)}, all, none, or a CRD's name "
                        "(plural.group). Default: none of them, a plain cluster (the first "
                        "line of the output says what was assumed). istio renders the "
                        "VirtualService and DestinationRule; inference-extension and "
                        "gateway-api, together, the InferencePools, pickers and HTTPRoute "
                        "of routing.mode InferenceGateway")
    parser.add_argument("--api-resources", type=Path, metavar="FILE",
                        help="the target cluster's `kubectl api-resources -o name` output: "
                        "the optional CRDs it lists count as served (with --cluster-has: "
                        "both)")
    parser.add_argument("--service-monitor", action="store_true",
                        help="same as --cluster-has servicemonitor")
    parser.add_argument("--keda", action="store_true", help="same as --cluster-has keda")
    parser.add_argument("--leader-worker-set", action="store_true",
                        help="same as --cluster-has lws")
    parser.add_argument("--no-model-version-children", action="store_true",
                        help="render only the GLMServices' children (not the cache PVC and "
                        "fetch Job of each ModelVersion)")


def served_crds(names: list[str], api_resources: str | None = None) -> list[str]:
    """The optional CRDs named (short names expanded), in OPTIONAL_CRDS' order."""
    crds: set[str] = set()
    for item in (n.strip() for chunk in names for n in chunk.split(",")):
        if not item or item == "none":
            continue
        if item == "all":
            crds |= set(OPTIONAL_CRDS)
        elif item in CRD_SETS:
            crds |= set(CRD_SETS[item])
        elif item in OPTIONAL_CRDS:
            crds.add(item)
        else:
            raise RenderCommandError(
                f"--cluster-has: {item!r} is none of {', '.join(CRD_SETS)}, all, none, nor an "
                f"optional CRD the operator reads ({', '.join(OPTIONAL_CRDS)})")
    if api_resources is not None:
        listed = {line.strip() for line in api_resources.splitlines()}
        crds |= {crd for crd in OPTIONAL_CRDS if crd in listed}
    return [crd for crd in OPTIONAL_CRDS if crd in crds]


def assumption(crds: list[str]) -> str:
    """The output's first line: which optional CRDs the objects were decided for."""
    if not crds:
        return ("# glm-operator render: for a cluster serving none of the optional CRDs "
                "(--cluster-has names those it serves)\n")
    short = [name for name, members in CRD_SETS.items() if set(members) <= set(crds)]
    loose = [crd for crd in crds
             if not any(crd in CRD_SETS[name] for name in short)]
    return f"# glm-operator render: for a cluster serving {', '.join([*short, *loose])}\n"


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


def _as_observed(doc: Obj, namespace: str) -> Obj:
    """The body a reconcile reads: namespace set, and a uid (OFFLINE_UID for one from git)."""
    meta = {"namespace": namespace, **(doc.get("metadata") or {})}
    meta.setdefault("uid", OFFLINE_UID)
    return {**doc, "metadata": meta}


def _fetched(body: Obj) -> Obj:
    """A ModelVersion from git as the fetch Job leaves it: Ready (a status of its own, read
    back from a cluster, is kept)."""
    if (body.get("status") or {}).get("phase"):
        return body
    return {**body, "status": {**(body.get("status") or {}), "phase": "Ready"}}


def _offline(objects: list[Obj]) -> list[Obj]:
    """Without the ownerReferences that point at OFFLINE_UID."""
    out = []
    for obj in objects:
        refs = obj["metadata"].get("ownerReferences")
        if refs is not None and any(r.get("uid") == OFFLINE_UID for r in refs):
            kept = [r for r in refs if r.get("uid") != OFFLINE_UID]
            meta = {k: v for k, v in obj["metadata"].items() if k != "ownerReferences"}
            if kept:
                meta["ownerReferences"] = kept
            obj = {**obj, "metadata": meta}
        out.append(obj)
    return out


def _condition_problems(decision: ServiceDecision,
                        types: tuple[GLMServiceConditionType, ...]) -> list[str]:
    return [f"{c.type}=False ({c.reason}): {c.message}" for c in decision.status.conditions
            if c.type in types and c.status == "False"]


def render_documents(
    docs: list[tuple[str, dict[str, Any]]],
    config: OperatorConfig,
    *,
    namespace: str,
    capabilities: Capabilities,
    model_version_children: bool = True,
    notes: list[str] | None = None,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """The children the operator would create for these GLMServices and ModelVersions, as
    its decisions give them; `notes` collects what the output lacks and why (a condition
    the operator would report False, such as missing CRDs)."""
    services: list[tuple[GLMService, Obj]] = []
    versions: dict[tuple[str, str], Obj] = {}
    for where, doc in docs:
        kind = doc.get("kind")
        if kind == GLMSERVICE:
            svc = _validated(GLMService, where, doc, namespace)
            services.append((svc, _as_observed(doc, svc.metadata.namespace)))
        elif kind == MODELVERSION:
            mv = _validated(ModelVersion, where, doc, namespace)
            versions[(mv.metadata.namespace, mv.metadata.name)] = _as_observed(
                doc, mv.metadata.namespace)
        else:
            raise RenderCommandError(f"{where}: kind {kind!r} is neither GLMService nor "
                                     "ModelVersion")
    if not services and not versions:
        raise RenderCommandError("no GLMService or ModelVersion in the input")
    now = now or datetime.now(UTC)
    objects: list[dict[str, Any]] = []
    if model_version_children:
        for body in versions.values():
            objects += _offline(decide_model_version(body, [], config, now).desired)
    for svc, body in services:
        name, ns = svc.metadata.name, svc.metadata.namespace
        if (ns, svc.spec.model_version) not in versions:
            raise RenderCommandError(
                f"GLMService {name}: spec.modelVersion {svc.spec.model_version!r} is not "
                f"among the inputs: pass its ModelVersion with another -f (namespace {ns})")
        service = GLMService.model_validate(body)
        model_versions = {key[1]: _fetched(mv) for key, mv in versions.items() if key[0] == ns}
        decision = decide_service(
            ServiceObservation(service=service, model_versions=model_versions,
                               capabilities=capabilities, now=now),
            config, config.profiles)
        problems = _condition_problems(decision, NOT_SERVED)
        if problems and not decision.desired:
            raise RenderCommandError(f"GLMService {name} would not be served: "
                                     + "; ".join(problems))
        if notes is not None:
            notes += [f"GLMService {name}: {p}"
                      for p in problems + _condition_problems(decision, NOTED)]
        objects += _offline(decision.desired)
    return objects


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"glm-operator render: operator config: {exc}", file=sys.stderr)
        return 1
    notes: list[str] = []
    try:
        named = [*args.cluster_has,
                 *(["servicemonitor"] if args.service_monitor else []),
                 *(["keda"] if args.keda else []),
                 *(["lws"] if args.leader_worker_set else [])]
        listed = None
        if args.api_resources is not None:
            try:
                listed = args.api_resources.read_text()
            except OSError as exc:
                raise RenderCommandError(
                    f"--api-resources {args.api_resources}: {exc.strerror or exc}") from exc
        crds = served_crds(named, listed)
        objects = render_documents(
            _documents(args.filename), config, namespace=args.namespace,
            capabilities=capabilities_of(crds),
            model_version_children=not args.no_model_version_children, notes=notes,
        )
    except (RenderCommandError, ValueError) as exc:
        print(f"glm-operator render: {exc}", file=sys.stderr)
        return 1
    for note in notes:
        print(f"glm-operator render: note: {note}", file=sys.stderr)
    sys.stdout.write(assumption(crds) + to_yaml(objects))
    return 0
