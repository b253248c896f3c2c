"""The background build of `make test`: one build per component however many processes ask
(e2e/cache.py build_lock), and the order the e2e modules run in (e2e/late_builds.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from e2e import late_builds

REPO = Path(__file__).resolve().parent.parent

# A "build" of 2 s under the lock, by a process that records when it ran and whether it found
# the component already built (as toolchain.ensure does).
BUILDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from e2e.cache import build_lock
    done = Path(sys.argv[1])
    with build_lock("thing", lambda line: print(line, flush=True)):
        print("holding", flush=True)
        if done.exists():
            print("cached", flush=True)
        else:
            time.sleep(2)
            done.write_text("built")
            print("built", flush=True)
""")


def test_a_second_process_waits_for_the_first_build_and_does_not_build_again(
        tmp_path: Path) -> None:
    env = {"GLM_OPERATOR_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO),
           "PATH": "/usr/bin:/bin"}
    done = tmp_path / "done"
    first = subprocess.Popen([sys.executable, "-c", BUILDER, str(done)], env=env,
                             stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None and first.stdout.readline() == "holding\n"
    second = subprocess.run([sys.executable, "-c", BUILDER, str(done)], env=env,
                            capture_output=True, text=True, timeout=30, check=True)
    out_first, _ = first.communicate(timeout=30)
    assert out_first.split() == ["built"]
    lines = second.stdout.splitlines()
    assert lines[0] == "waiting for thing: another process is building it", lines
    assert lines[-2:] == ["holding", "cached"], lines


def test_a_killed_build_leaves_no_lock_behind(tmp_path: Path) -> None:
    env = {"GLM_OPERATOR_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO),
           "PATH": "/usr/bin:/bin"}
    done = tmp_path / "done"
    hung = subprocess.Popen([sys.executable, "-c", BUILDER.replace("sleep(2)", "sleep(60)"),
                             str(done)], env=env, stdout=subprocess.PIPE, text=True)
    assert hung.stdout is not None and hung.stdout.readline() == "holding\n"
    hung.kill()
    hung.wait(timeout=10)
    after = subprocess.run([sys.executable, "-c", BUILDER, str(done)], env=env,
                           capture_output=True, text=True, timeout=30, check=True)
    # No wait: the kernel dropped the dead one's lock.
    assert after.stdout.split() == ["holding", "built"]


class Item:
    """What late_builds reads of a pytest item: its file, fixtures and markers."""

    def __init__(self, path: str, fixtures: tuple[str, ...] = (),
                 markers: tuple[str, ...] = ()) -> None:
        self.fspath = str(REPO / path)
        self.fixturenames = fixtures
        self.markers = markers
        self.nodeid = path

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


def test_modules_needing_late_components_run_last_in_the_order_they_are_built() -> None:
    items = [
        Item("e2e/test_a_gateway.py", markers=("llama",)),
        Item("e2e/test_b_operator.py"),
        Item("e2e/test_c_s3.py", fixtures=("minio", "kubectl")),
        Item("e2e/test_c_s3.py", fixtures=("kubectl",)),  # same module: stays with it
        Item("tests/test_unit.py"),
        Item("e2e/test_d_hpa.py", fixtures=("custom_metrics",)),
        Item("e2e/test_e_smoke.py"),
    ]
    late_builds.order(items, late_builds.is_e2e)  # type: ignore[arg-type]
    assert [str(Path(i.fspath).relative_to(REPO)) for i in items] == [
        "e2e/test_b_operator.py", "tests/test_unit.py", "e2e/test_e_smoke.py",
        "e2e/test_c_s3.py", "e2e/test_c_s3.py", "e2e/test_d_hpa.py", "e2e/test_a_gateway.py",
    ]


@pytest.mark.parametrize(("fixtures", "markers", "expected"), [
    ((), (), ()),
    (("llama_binary", "kubectl"), ("llama",), ("llama_cpp_python",)),
    (("vllm_python",), (), (late_builds.VLLM,)),
    (("lws_crd", "lws_cluster"), (), ("lws",)),
    (("epp_binary", "kubectl"), (), ("epp",)),
    (("lws",), (), ()),  # a parametrize argument of a unit test, not the fixture
])
def test_what_a_test_needs_comes_from_its_fixtures_and_markers(
        fixtures: tuple[str, ...], markers: tuple[str, ...], expected: tuple[str, ...]) -> None:
    assert late_builds.needs(Item("e2e/x.py", fixtures, markers)) == expected  # type: ignore[arg-type]
    unit = Item("tests/render/x.py", fixtures, markers)
    assert late_builds.needs(unit) == ()  # type: ignore[arg-type]


def test_every_late_component_is_one_the_toolchain_builds_or_the_vllm_venv() -> None:
    from e2e import toolchain

    named = {c for components in (*late_builds.BY_FIXTURE.values(),
                                  *late_builds.BY_MARKER.values()) for c in components}
    known = set(toolchain.BUILDERS) | {late_builds.VLLM}
    assert named <= known
    assert not named & set(toolchain.FIRST), "a FIRST component is built before any test"
