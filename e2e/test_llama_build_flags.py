"""The CPU llama-server flags live in one list; the file the runtime image reads is generated
from it, and the flags make a static, portable, server-only build."""

from __future__ import annotations

from e2e import llama_build


def test_flags_file_is_generated_from_the_list() -> None:
    assert llama_build.FLAGS_FILE.read_text() == llama_build.flags_file_text(), (
        "runtime-images/llamacpp/cmake-flags-cpu.txt is stale: "
        "run `python -m e2e.llama_build flags`"
    )
    assert llama_build.read_flags_file() == list(llama_build.LLAMA_CPU_CMAKE_FLAGS)


def test_flags_build_a_static_portable_server() -> None:
    flags = set(llama_build.LLAMA_CPU_CMAKE_FLAGS)
    assert {"-DLLAMA_BUILD_SERVER=ON", "-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF",
            "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF"} <= flags
    assert len(flags) == len(llama_build.LLAMA_CPU_CMAKE_FLAGS)
