"""The docs hold: every Kubernetes object in a ```yaml block of docs/*.md and README.md is
accepted by the API server (server-side apply, dry run, with glm-operator's CRDs and the
third-party ones installed), and every relative link between them resolves, anchors included.

A block that is deliberately incomplete is marked with `<!-- fragment -->` on the line before
its opening fence. A block whose documents have no apiVersion/kind (helm values, operator
config, prometheus-adapter rules) is not a Kubernetes object and is not applied.
"""

from __future__ import annotations

import re
import textwrap
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.kubectl import Kubectl, KubectlError
from e2e.operator_fixtures import glm_crds

__all__ = ["glm_crds"]  # fixture used by name

REPO = Path(__file__).resolve().parent.parent
DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
FRAGMENT_MARK = "<!-- fragment -->"
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<info>[\w+-]*)")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    info: str
    text: str
    fragment: bool

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def code_blocks(path: Path) -> list[Block]:
    blocks: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence = match.group("indent"), match.group("fence")
        previous = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()),
                        "")
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        blocks.append(Block(path, i + 1, match.group("info").lower(),
                            textwrap.dedent("\n".join(body)) + "\n", previous == FRAGMENT_MARK))
        i = j + 1
    return blocks


def kubernetes_objects(block: Block) -> list[dict[str, Any]]:
    """The block's documents when they are Kubernetes objects; [] when none is."""
    documents = [d for d in yaml.safe_load_all(block.text) if d is not None]
    objects = [d for d in documents if isinstance(d, dict) and "apiVersion" in d and "kind" in d]
    if objects and len(objects) != len(documents):
        raise AssertionError(f"{block.where}: mixes Kubernetes objects with other documents; "
                             f"split it or mark it {FRAGMENT_MARK}")
    return objects


def _yaml_blocks() -> list[Block]:
    return [b for path in DOCS for b in code_blocks(path) if b.info in ("yaml", "yml")]


def _object_blocks() -> list[Block]:
    return [b for b in _yaml_blocks() if not b.fragment and kubernetes_objects(b)]


def test_the_docs_have_kubernetes_examples() -> None:
    # The test below must see the examples; a parser that found none would pass vacuously.
    where = {b.path.name for b in _object_blocks()}
    assert {"README.md", "concepts.md", "gitops.md", "quickstart.md"} <= where, where


def test_every_yaml_block_parses() -> None:
    for block in _yaml_blocks():
        if block.fragment:
            continue
        try:
            kubernetes_objects(block)
        except yaml.YAMLError as exc:
            raise AssertionError(f"{block.where}: not YAML: {exc}") from exc


@pytest.mark.parametrize("block", _object_blocks(), ids=lambda b: b.where)
def test_kubernetes_example_is_accepted_by_the_api_server(
        block: Block, glm_crds: list[str], kubectl: Kubectl, namespace: str) -> None:
    objects = kubernetes_objects(block)
    for obj in objects:
        # Into the test's namespace, whatever the example says (cluster-scoped kinds ignore it).
        obj.get("metadata", {}).pop("namespace", None)
    try:
        kubectl("apply", "--server-side", "--dry-run=server", "--field-manager=glm-e2e-docs",
                "-n", namespace, "-f", "-", input=yaml.safe_dump_all(objects))
    except KubectlError as exc:
        raise AssertionError(f"{block.where}: the API server refused the example:\n"
                             f"{exc.stderr}") from exc


# --- links -----------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`]*`")


def _prose_lines(path: Path) -> list[tuple[int, str]]:
    """Lines outside fenced and indented code blocks, without inline code spans."""
    result, in_fence, fence = [], False, ""
    previous_blank = True
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = FENCE.match(line)
        if in_fence:
            if line.strip().startswith(fence):
                in_fence = False
            continue
        if match:
            in_fence, fence = True, match.group("fence")
            continue
        if line.startswith("    ") and previous_blank:  # an indented code block
            continue
        previous_blank = not line.strip()
        result.append((number, INLINE_CODE.sub("", line)))
    return result


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = INLINE_CODE.sub(lambda m: m.group(0).strip("`"), heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    for _, line in _prose_lines_with_code_headings(path):
        match = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = github_anchor(match.group(2))
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def _prose_lines_with_code_headings(path: Path) -> list[tuple[int, str]]:
    """Like _prose_lines, but keeping inline code (headings keep its text in their anchor)."""
    lines = path.read_text().splitlines()
    prose = {n for n, _ in _prose_lines(path)}
    return [(n, lines[n - 1]) for n in sorted(prose)]


def _links() -> list[tuple[Path, int, str]]:
    return [(path, number, m.group("target"))
            for path in DOCS for number, line in _prose_lines(path)
            for m in LINK.finditer(line)]


def test_the_docs_link_to_each_other() -> None:
    assert any(t.endswith(".md") for _, _, t in _links())  # the scan finds links at all


def test_every_relative_link_resolves() -> None:
    broken = []
    for path, number, target in _links():
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(REPO)}:{number}: {target}"
        if not resolved.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{where} (no heading with anchor #{anchor})")
    assert not broken, "\n".join(broken)
