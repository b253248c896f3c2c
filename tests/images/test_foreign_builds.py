"""The pure parts of the other architecture's image builds (e2e/images_foreign.py): when
emulation is there or what is missing, where each build is tagged, what the cache forgets, and
the ELF header check the release test reads binaries with."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e import images, images_foreign

NOT_NATIVE = "arm64" if images.native_arch() == "amd64" else "amd64"
QEMU = images_foreign.QEMU_NAMES[NOT_NATIVE]


@pytest.fixture
def binfmt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A binfmt_misc folder and a binfmt.d folder of the test's own."""
    proc, definitions = tmp_path / "binfmt_misc", tmp_path / "binfmt.d"
    proc.mkdir()
    definitions.mkdir()
    monkeypatch.setattr(images_foreign, "BINFMT", proc)
    monkeypatch.setattr(images_foreign, "BINFMT_DEFINITIONS", definitions)
    return proc, definitions


def test_this_machines_architecture_needs_no_emulation(binfmt: tuple[Path, Path]) -> None:
    assert images_foreign.emulation_problem(images.native_arch()) is None


def test_without_qemu_the_problem_names_make_deps(binfmt: tuple[Path, Path]) -> None:
    problem = images_foreign.emulation_problem(NOT_NATIVE)
    assert problem is not None
    assert "make deps" in problem and "qemu-user-static" in problem


def test_an_unknown_architecture_is_named() -> None:
    problem = images_foreign.emulation_problem("riscv64")
    assert problem is not None and "riscv64" in problem


def test_a_disabled_handler_says_how_to_enable_it(binfmt: tuple[Path, Path]) -> None:
    proc, _ = binfmt
    (proc / f"qemu-{QEMU}").write_text("disabled\n")
    problem = images_foreign.emulation_problem(NOT_NATIVE)
    assert problem is not None and "echo 1 >" in problem
    (proc / f"qemu-{QEMU}").write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/x\n")
    assert images_foreign.emulation_problem(NOT_NATIVE) is None


def test_the_definition_is_registered_without_its_comments(binfmt: tuple[Path, Path]) -> None:
    proc, definitions = binfmt
    line = f":qemu-{QEMU}:M::\\x7fELF:\\xff:/usr/libexec/qemu-binfmt/{QEMU}-binfmt-P:OPF"
    (definitions / f"qemu-{QEMU}.conf").write_text(f"# a comment\n\n{line}\n")
    (proc / "register").write_text("")
    images_foreign.ensure_emulation(NOT_NATIVE)
    assert (proc / "register").read_text() == line + "\n"


def test_a_fresh_machine_gets_binfmt_misc_mounted(
        binfmt: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Not mounted: the build mounts it (the mount here is the test's stand-in: a command that
    leaves the register file, as the kernel's mount does), then registers the definition."""
    proc, definitions = binfmt
    line = f":qemu-{QEMU}:M::\\x7fELF:\\xff:/usr/libexec/qemu-binfmt/{QEMU}-binfmt-P:OPF"
    (definitions / f"qemu-{QEMU}.conf").write_text(line + "\n")
    ran: list[list[str]] = []

    def mount() -> list[str]:
        command = ["touch", str(proc / "register")]
        ran.append(command)
        return command

    monkeypatch.setattr(images_foreign, "mount_command", mount)
    assert images_foreign.emulation_problem(NOT_NATIVE) is None
    images_foreign.ensure_emulation(NOT_NATIVE)
    assert len(ran) == 1
    assert (proc / "register").read_text() == line + "\n"
    # Mounted already: no second mount.
    (proc / "register").write_text("")
    images_foreign.ensure_emulation(NOT_NATIVE)
    assert len(ran) == 1


def test_a_mount_that_fails_says_what_to_run(
        binfmt: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    proc, definitions = binfmt
    (definitions / f"qemu-{QEMU}.conf").write_text(f":qemu-{QEMU}:M::x:y:/q:F\n")
    monkeypatch.setattr(images_foreign, "mount_command",
                        lambda: ["sh", "-c", "echo 'sudo: a password is required' >&2; exit 1"])
    with pytest.raises(images_foreign.EmulationUnavailable) as raised:
        images_foreign.ensure_emulation(NOT_NATIVE)
    message = str(raised.value)
    assert "not mounted" in message and "a password is required" in message
    assert f"sudo mount -t binfmt_misc binfmt_misc {proc}" in message
    assert not (proc / "register").exists()


def test_root_mounts_directly_and_others_through_sudo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images_foreign.os, "geteuid", lambda: 0)
    assert images_foreign.mount_command()[0] == "mount"
    monkeypatch.setattr(images_foreign.os, "geteuid", lambda: 1000)
    assert images_foreign.mount_command()[:3] == ["sudo", "-n", "mount"]


def test_another_architectures_build_is_tagged_and_cached_apart() -> None:
    spec = images.python_spec()
    foreign = images_foreign.foreign_spec(spec, NOT_NATIVE)
    assert foreign.reference == f"{spec.reference}-{NOT_NATIVE}"
    assert foreign.platform == f"linux/{NOT_NATIVE}"
    assert spec.platform == f"linux/{images.native_arch()}"
    assert foreign.cache_tag("abc").endswith(f":inputs-abc-{NOT_NATIVE}")
    assert spec.cache_tag("abc").endswith(":inputs-abc")  # this machine's name is unchanged
    assert images.base_reference(NOT_NATIVE) == f"{images.base_reference()}-{NOT_NATIVE}"


def test_the_cache_forgets_only_the_same_architectures_older_builds(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    repository = images.python_spec().reference.rsplit(":", 1)[0]
    tags = [f"{repository}:inputs-old", f"{repository}:inputs-new",
            f"{repository}:inputs-old-{NOT_NATIVE}", f"{repository}:inputs-new-{NOT_NATIVE}",
            f"{repository}:0.1.0"]
    removed: list[list[str]] = []

    class Result:
        stdout = "\n".join(tags)

    def run(cmd: list[str], step: str, timeout: float = 0, check: bool = True) -> Result:
        if "rmi" in cmd:
            removed.append(cmd[cmd.index("rmi") + 1:])
        return Result()

    monkeypatch.setattr(images.Store, "run", lambda self, *args, **kwargs: run(*args, **kwargs))
    store = images.Store(tmp_path)
    foreign = images_foreign.foreign_spec(images.python_spec(), NOT_NATIVE)
    images.forget_older_builds(store, foreign, foreign.cache_tag("new"))
    assert removed == [[f"{repository}:inputs-old-{NOT_NATIVE}"]]
    removed.clear()
    spec = images.python_spec()
    images.forget_older_builds(store, spec, spec.cache_tag("new"))
    assert removed == [[f"{repository}:inputs-old"]]


def test_elf_machine_reads_the_header(tmp_path: Path) -> None:
    arm = tmp_path / "arm"
    arm.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(11) + (183).to_bytes(2, "little") + bytes(8))
    assert images_foreign.elf_machine(arm) == 183
    script = tmp_path / "script"
    script.write_bytes(b"#!/bin/sh\n" + bytes(20))
    with pytest.raises(ValueError, match="not an ELF"):
        images_foreign.elf_machine(script)
