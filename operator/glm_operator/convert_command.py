"""`glm-operator convert -f old.yaml`: manifests rewritten at another API version, for Git.

GitOps repositories hold GLMServices written at v1alpha1; the API server keeps serving them
(the operator's conversion webhook), and this rewrites them once at v1alpha2 with the same
conversion the webhook applies (api/conversion.py), so what Git holds and what the cluster
stores agree. Documents of other kinds pass through unchanged; the order is kept.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from glm_operator.api.conversion import (
    KINDS,
    SERVED_VERSIONS,
    STORAGE_VERSION,
    ConversionError,
    api_version,
    convert,
)
from glm_operator.wellknown import GROUP


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", action="append", required=True,
                        help="a manifest file (several documents allowed), or - for stdin; "
                        "repeatable")
    parser.add_argument("--to", choices=SERVED_VERSIONS, default=STORAGE_VERSION,
                        help=f"the API version to write (default {STORAGE_VERSION})")


def converted(document: Any, version: str) -> Any:
    """One document at `version` when it is one of ours, else as it was."""
    if (not isinstance(document, dict) or document.get("kind") not in KINDS
            or not str(document.get("apiVersion", "")).startswith(f"{GROUP}/")):
        return document
    return convert(document, api_version(version))


def run(args: argparse.Namespace) -> int:
    documents: list[Any] = []
    for name in args.filename:
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
            documents += [d for d in yaml.safe_load_all(text) if d is not None]
        except (OSError, yaml.YAMLError) as exc:
            print(f"glm-operator convert: {name}: {exc}", file=sys.stderr)
            return 2
    try:
        out = [converted(d, args.to) for d in documents]
    except ConversionError as exc:
        print(f"glm-operator convert: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(yaml.safe_dump_all(out, sort_keys=False, default_flow_style=False))
    return 0
