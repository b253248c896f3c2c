"""The GitHub Actions workflows: actionlint finds nothing in .github/workflows (and does find a
broken workflow: the control), the pull-request workflow runs the README's test command, and
the release workflow releases every image scripts/release.py knows, through that script.

actionlint is built by the toolchain (e2e/versions.toml [actionlint], in toolchain.FIRST, so
`make test` has it before the unit tests run); in CI a missing one fails the test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import toolchain
from scripts import release

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / ".github" / "workflows"


@pytest.fixture(scope="module")
def actionlint() -> Path:
    if not toolchain.is_cached("actionlint") and shutil.which("go") is None:
        message = "actionlint is not built and there is no Go: `make toolchain`"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return toolchain.ensure("actionlint") / "actionlint"


def lint(binary: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    # shellcheck and pyflakes off: actionlint runs them when they are on PATH, and neither is
    # among the packages the tests install, so the result would differ between machines.
    return subprocess.run([str(binary), "-no-color", "-shellcheck=", "-pyflakes=",
                           *map(str, files)], capture_output=True, text=True, check=False,
                          cwd=REPO, timeout=120)


def workflow(name: str) -> dict[Any, Any]:
    data: dict[Any, Any] = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as True.
    data["on"] = data.pop(True, data.get("on"))
    return data


def steps(data: dict[Any, Any]) -> list[dict[str, Any]]:
    return [step for job in data["jobs"].values() for step in job["steps"]]


def test_the_workflows_pass_actionlint(actionlint: Path) -> None:
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert {"release.yml", "test.yml"} <= {f.name for f in files}
    result = lint(actionlint, *files)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


BROKEN = {
    # An expression naming a context that does not exist.
    "undefined context": ("${{ github.ref }}", "${{ gihtub.ref }}", "undefined variable"),
    # A job that says neither where it runs nor which workflow it calls.
    "no runs-on": ("    runs-on: ubuntu-24.04\n", "", "runs-on"),
    # An input the action does not have.
    "unknown input": ("go-version: \"1.26.8\"", "go-versoin: \"1.26.8\"", "go-versoin"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_actionlint_reports_a_broken_workflow(actionlint: Path, tmp_path: Path,
                                              case: str) -> None:
    """The control: the same check on a copy of test.yml with one mistake fails, naming it."""
    old, new, reported = BROKEN[case]
    text = (WORKFLOWS / "test.yml").read_text()
    assert old in text
    broken = tmp_path / ".github" / "workflows" / "test.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(text.replace(old, new, 1))
    result = lint(actionlint, broken)
    assert result.returncode == 1, result.stdout + result.stderr
    assert reported in result.stdout, result.stdout


def test_pull_requests_run_the_readme_test_command() -> None:
    data = workflow("test.yml")
    assert "pull_request" in data["on"]
    runs = [step.get("run", "") for step in steps(data)]
    assert "bash .ci/run" in runs
    assert "make test" in (REPO / ".ci" / "run").read_text().splitlines()
    assert "make test" in (REPO / "README.md").read_text()


def test_the_release_runs_on_a_tag_through_the_release_script() -> None:
    data = workflow("release.yml")
    assert data["on"] == {"push": {"tags": ["v*"]}}
    matrix = data["jobs"]["images"]["strategy"]["matrix"]["image"]
    assert matrix == [image.name for image in release.release_images()]
    runs = "\n".join(step.get("run", "") for step in steps(data))
    for command in ("release.py check", "release.py buildx", "--push", "release.py sbom",
                    "release.py chart"):
        assert command in runs, command
    # The pins the workflow installs are the ones the toolchain builds.
    withs = {step["uses"].split("@")[0]: step.get("with", {}) for step in steps(data)
             if "uses" in step}
    assert withs["anchore/sbom-action/download-syft"]["syft-version"] == \
        toolchain.versions()["syft"]
    assert withs["azure/setup-helm"]["version"] == toolchain.versions()["helm"]
