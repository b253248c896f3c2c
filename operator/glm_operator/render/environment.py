"""One jinja2 environment for every template: strict, and YAML-safe by construction.

Every scalar goes through the `q` filter (JSON encoding, which is valid YAML), so a value
can never inject structure. Each template renders one object; the output is parsed with
`yaml.safe_load` and checked to be a single mapping with apiVersion, kind and metadata.
"""

from __future__ import annotations

import json
from typing import Any

import jinja2
import yaml

ENVIRONMENT = jinja2.Environment(
    loader=jinja2.PackageLoader("glm_operator.render", "templates"),
    undefined=jinja2.StrictUndefined,
    autoescape=False,  # YAML, not HTML: escaping is done by the `q` filter instead
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
    # Templates ship inside the package and never change at run time: skip the per-render
    # mtime check (render runs on every reconcile of every service).
    auto_reload=False,
)
# libyaml's loader when present: rendering thousands of services parses a lot of YAML.
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _quote(value: Any) -> str:
    """JSON-encode a value for YAML (strings quoted, dicts and lists as flow mappings)."""
    return json.dumps(value, sort_keys=False, ensure_ascii=False)


ENVIRONMENT.filters["q"] = _quote


class RenderError(ValueError):
    """A template produced something that is not one Kubernetes object."""


def render_object(template: str, **context: Any) -> dict[str, Any]:
    text = ENVIRONMENT.get_template(template).render(**context)
    try:
        obj = yaml.load(text, Loader=_LOADER)  # a safe loader: plain data only
    except yaml.YAMLError as exc:
        raise RenderError(f"{template} rendered invalid YAML: {exc}") from exc
    if not isinstance(obj, dict) or not {"apiVersion", "kind", "metadata"} <= obj.keys():
        raise RenderError(f"{template} must render one object with apiVersion, kind and metadata")
    return obj
