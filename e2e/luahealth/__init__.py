"""Build and run `luahealth`, the Go program that runs Argo CD health scripts as Argo CD does.

The program (main.go here, its own Go module) reproduces Argo CD's Lua VM setup on the
interpreter Argo CD embeds (github.com/yuin/gopher-lua); see the comment at its top. It is
built once per version of its sources and cached like the toolchain's components:

    ~/.cache/glm-operator/luahealth-<sha256 of go.mod, go.sum, *.go>/luahealth
    (GLM_OPERATOR_CACHE moves ~/.cache/glm-operator)

    luahealth test DIR                  every health_test.yaml under DIR, both VM modes
    luahealth eval -argocd-cm CM FILE   the health Argo CD computes for live objects
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.cache import cache_root

SOURCE_DIR = Path(__file__).resolve().parent
REPO = SOURCE_DIR.parent.parent
CUSTOMIZATIONS = REPO / "charts" / "argocd" / "resource_customizations"
ARGOCD_CM = REPO / "charts" / "argocd" / "argocd-cm.yaml"
COMPLETE_MARKER = ".complete"


class LuaHealthBuildError(RuntimeError):
    """`go build` of luahealth failed; the message has the Go output."""


def _sources() -> list[Path]:
    return sorted([SOURCE_DIR / "go.mod", SOURCE_DIR / "go.sum", *SOURCE_DIR.glob("*.go")])


def source_hash() -> str:
    digest = hashlib.sha256()
    for path in _sources():
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def binary_path() -> Path:
    return cache_root() / f"luahealth-{source_hash()}" / "luahealth"


def build() -> Path:
    """The cached binary, built first when its sources changed."""
    target = binary_path()
    if (target.parent / COMPLETE_MARKER).exists() and target.exists():
        return target
    go = shutil.which("go")
    if go is None:
        raise LuaHealthBuildError("`go` is not on PATH: luahealth is a Go program")
    env = dict(os.environ, CGO_ENABLED="0", GOTOOLCHAIN="local")
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    # Build into a fresh directory and rename it into place: two sessions never see half.
    staging = Path(tempfile.mkdtemp(prefix=target.parent.name + ".", dir=target.parent.parent))
    try:
        result = subprocess.run(
            [go, "build", "-trimpath", "-o", str(staging / "luahealth"), "."],
            cwd=SOURCE_DIR, env=env, capture_output=True, text=True, check=False, timeout=900)
        if result.returncode != 0:
            raise LuaHealthBuildError(
                f"go build of {SOURCE_DIR} failed (exit {result.returncode}):\n"
                f"{(result.stdout + result.stderr)[-4000:]}")
        (staging / COMPLETE_MARKER).write_text(source_hash() + "\n")
        if target.parent.exists() and not (target.parent / COMPLETE_MARKER).exists():
            shutil.rmtree(target.parent)  # left by an interrupted build
        try:
            staging.rename(target.parent)
        except OSError:  # another session finished the same build first
            if not (target.parent / COMPLETE_MARKER).exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def build_for_tests() -> Path:
    """`build()` for a pytest test: a failed build FAILS in CI (CI=true) and everywhere when
    `go` exists (then it is a real error); only a machine without `go` skips, locally."""
    import pytest  # test infrastructure only

    try:
        return build()
    except LuaHealthBuildError as exc:
        in_ci = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")
        if shutil.which("go") is None and not in_ci:
            pytest.skip(str(exc))
        pytest.fail(str(exc), pytrace=False)


@dataclass(frozen=True)
class CaseResult:
    """One health_test.yaml case run in one VM mode (argocd-test or argocd-cm)."""

    case: str
    mode: str
    ok: bool
    expected: dict[str, str]
    got: dict[str, str] | None
    error: str | None

    def explain(self) -> str:
        return (f"{self.case} [{self.mode}]: expected {self.expected}, "
                + (f"error {self.error}" if self.error else f"got {self.got}"))


def run_tests(binary: Path, customizations: Path = CUSTOMIZATIONS) -> list[CaseResult]:
    """Every health_test.yaml case under `customizations`, as Argo CD's own test runs it."""
    result = subprocess.run([str(binary), "test", str(customizations)], capture_output=True,
                            text=True, check=False, timeout=300)
    if result.returncode not in (0, 1):
        raise RuntimeError(f"luahealth test failed (exit {result.returncode}): {result.stderr}")
    cases = []
    for line in result.stdout.splitlines():
        raw = json.loads(line)
        cases.append(CaseResult(raw["case"], raw["mode"], raw["ok"], raw["expected"],
                                raw.get("got"), raw.get("error")))
    return cases


def evaluate(binary: Path, objects: list[dict[str, Any]], workdir: Path,
             argocd_cm: Path = ARGOCD_CM) -> list[dict[str, Any]]:
    """The health Argo CD's controller computes for live `objects` with argocd-cm's scripts:
    one {kind, namespace, name, status, message, error} per object."""
    path = workdir / "objects.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    result = subprocess.run([str(binary), "eval", "-argocd-cm", str(argocd_cm), str(path)],
                            capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"luahealth eval failed (exit {result.returncode}): {result.stderr}")
    return [json.loads(line) for line in result.stdout.splitlines()]
