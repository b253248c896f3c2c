"""The message of an Infeasible plan: why it does not fit, and each nearest configuration that
does as the `kubectl patch` that applies it (pure).

Every printed patch was applied to the service offline (the API's rules, mirrored by the
pydantic types) and the patched service planned again, every pool, and its pods placed on
the one node of a ReadWriteOnce cache (decide/cache_placement.py) and on nodes its images
have a build for (decide/image_architecture.py): what the message offers is what fits and
runs. An alternative no patch of the GLMService applies (a quantization with no
ModelVersion of it in the namespace) is named as such, without a command.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from glm_operator.api import GLMService, ModelVersion
from glm_operator.config import OperatorConfig
from glm_operator.decide.cache_placement import cache_placement_problem
from glm_operator.decide.image_architecture import image_architecture_problem
from glm_operator.planning.accelerators import AcceleratorProfile
from glm_operator.planning.from_api import Acceptable, applicable_alternatives
from glm_operator.planning.planner import Plan, gib

MAX_PATCHES = 8


def _cache_placeable(service: GLMService, model_version: ModelVersion, main: Plan,
                     long_context: Plan | None) -> bool:
    """A patch must not trade Infeasible for CacheNotShareable (more devices or nodes than
    the one node of a ReadWriteOnce cache)."""
    return cache_placement_problem(service, model_version, main, long_context) is None


def _runnable(config: OperatorConfig | None) -> Acceptable:
    """Nor for NoImageForNodeArchitecture (a profile whose nodes no image build runs on)."""
    def acceptable(service: GLMService, model_version: ModelVersion, main: Plan,
                   long_context: Plan | None) -> bool:
        return _cache_placeable(service, model_version, main, long_context) and (
            config is None
            or image_architecture_problem(service, main, long_context, config) is None)
    return acceptable


def infeasible_message(pool: str, p: Plan, service: GLMService, model_version: ModelVersion,
                       model_versions: Sequence[ModelVersion] = (),
                       profiles: Mapping[str, AcceleratorProfile] | None = None,
                       config: OperatorConfig | None = None) -> str:
    message = f"{pool} pool does not fit: {p.reason}"
    applied, left = applicable_alternatives(service, model_version, p, model_versions,
                                            profiles, _runnable(config))
    if applied:
        options = "; ".join(
            f"{a.alternative.change} fits with {gib(a.alternative.headroom_bytes)} GiB "
            f"headroom: {a.command(service)}"
            for a in applied[:MAX_PATCHES])
        message += f". Nearest that fit, each applied by its patch: {options}"
    quantizations = [a for a in left if set(a.settings) == {"quantization"}]
    if quantizations:
        a = quantizations[0]
        change = a.change[:1].upper() + a.change[1:]
        message += (f". {change} would fit with {gib(a.headroom_bytes)} GiB headroom, but "
                    "the quantization is the ModelVersion's: create a "
                    "ModelVersion of that file and point spec.modelVersion at it")
    if not applied and not quantizations:
        message += ". No nearby configuration fits"
    return message
