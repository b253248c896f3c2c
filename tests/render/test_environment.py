"""The template environment: values never become structure, outputs never share state."""

from __future__ import annotations

import jinja2
import pytest
from glm_operator.render.environment import ENVIRONMENT, render_object
from glm_operator.render.output import to_yaml
from glm_operator.render.service import render_service

from render.cases import golden_inputs

HOSTILE = [
    "a\nkind: Secret",
    "x: {y: z}",
    "- item",
    "__glm_value_0__",  # a value that looks like a placeholder stays a value
    "'; DROP TABLE",
    "",
    "null",
    "yes",
    "0o17",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_values_cannot_inject_structure(value: str) -> None:
    obj = render_object("serviceaccount.yaml.j2",
                        metadata={"name": value, "namespace": "n", "labels": {"k": value}})
    assert obj["metadata"]["name"] == value
    assert obj["metadata"]["labels"] == {"k": value}
    assert obj["kind"] == "ServiceAccount"


def test_undefined_variables_fail() -> None:
    with pytest.raises(jinja2.UndefinedError):
        render_object("role.yaml.j2", metadata={"name": "a", "namespace": "n", "labels": {}})


def test_q_outside_render_object_is_plain_json() -> None:
    assert ENVIRONMENT.from_string("{{ v | q }}").render(v={"a": [1, "b"]}) == '{"a": [1, "b"]}'


def test_outputs_share_nothing_with_each_other_or_the_cache() -> None:
    inputs = golden_inputs("vllm", "a100x2")
    first = render_service(inputs)
    reference = to_yaml(render_service(inputs))
    for obj in first:  # a caller scribbling over its copy
        obj["metadata"]["labels"]["scribble"] = "x"
        obj.setdefault("spec", {})["scribble"] = "x"
        if obj["kind"] == "HorizontalPodAutoscaler":
            obj["spec"]["behavior"]["scaleDown"]["policies"].append("x")
    assert to_yaml(render_service(inputs)) == reference
    assert "&id" not in reference
