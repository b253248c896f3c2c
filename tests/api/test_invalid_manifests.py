"""The pydantic types refuse every invalid manifest the API server refuses (offline parity)."""

from __future__ import annotations

import pytest
from glm_operator.api import GLMService, ModelVersion
from invalid_manifests import InvalidCase, load_cases, merge  # tests/api is on sys.path
from pydantic import ValidationError

CASES = load_cases()
MODELS = {"GLMService": GLMService, "ModelVersion": ModelVersion}


def test_the_table_is_big_enough_and_names_fields() -> None:
    assert len(CASES) >= 15
    assert len({case.name for case in CASES}) == len(CASES)
    for case in CASES:
        # The first expected string is the field path the message must name.
        assert case.expect[0].startswith("spec.") or case.name == "misspelt-field", case


@pytest.mark.parametrize("case", [c for c in CASES if c.update is None], ids=lambda c: c.name)
def test_types_refuse_invalid_create(case: InvalidCase) -> None:
    with pytest.raises(ValidationError):
        MODELS[case.kind].model_validate(case.manifest("x"))


@pytest.mark.parametrize("case", [c for c in CASES if c.update is not None], ids=lambda c: c.name)
def test_update_cases_start_from_a_valid_object(case: InvalidCase) -> None:
    # Immutability is a transition rule only the API server can check; both the initial
    # and the updated spec are valid on their own.
    MODELS[case.kind].model_validate(case.manifest("x"))
    MODELS[case.kind].model_validate(case.manifest("x", case.update))


def test_merge_semantics() -> None:
    assert merge({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"b": None, "d": 3}, "l": [2]}) == {
        "a": {"c": 2, "d": 3},
        "l": [2],
    }
