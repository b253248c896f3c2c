"""Fixtures for the chart tests: the real helm binary (built by e2e/toolchain.py) and a
`render` that runs `helm template` and parses what it prints.

helm is part of the pinned toolchain (`python -m e2e.toolchain build helm`). Without it
these tests skip locally and FAIL in CI (CI=true): a chart that was never rendered is not
tested.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import yaml
from chart_helm import Helm, Obj, helm_binary  # tests/chart is on sys.path


@pytest.fixture(scope="session")
def helm() -> Helm:
    binary = helm_binary()
    if binary is None:
        message = ("helm is not built: `.venv/bin/python -m e2e.toolchain build helm` "
                   "(make toolchain)")
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return Helm(binary)


@pytest.fixture(scope="session")
def render(helm: Helm) -> Callable[..., list[Obj]]:
    """`render(values=None, release="glm", namespace="glm-system")`: parsed `helm template`."""
    cache: dict[str, list[Obj]] = {}

    def _render(values: Mapping[str, Any] | None = None, **kw: Any) -> list[Obj]:
        key = yaml.safe_dump([values, kw])
        if key not in cache:
            cache[key] = helm.template(values, **kw)
        return yaml.safe_load(yaml.safe_dump(cache[key]))  # a fresh copy per caller

    return _render
