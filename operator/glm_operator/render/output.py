"""Objects -> multi-document YAML, byte-for-byte stable (CLI output, golden files)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

_BASE: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Dumper(_BASE):  # type: ignore[misc,valid-type]
    """Never `&id001` anchors, even if a builder reused a value: manifests stay plain."""

    def ignore_aliases(self, data: object) -> bool:
        return True


_DUMPER = _Dumper


def to_yaml(objects: Iterable[dict[str, Any]]) -> str:
    return yaml.dump_all(
        list(objects), Dumper=_DUMPER, sort_keys=False, explicit_start=True,
        default_flow_style=False, allow_unicode=True, width=100,
    )
