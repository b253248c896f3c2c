"""The pinned llama.cpp source tree (vendored in the llama-cpp-python sdist), for tests that
read what the engine itself registers: its architecture names, its GGUF tensor maps.

Downloaded once from PyPI and kept unpacked under
`~/.cache/glm-operator/llama_cpp_python-<version>-src/` (GLM_OPERATOR_CACHE overrides the
root); marked complete only after the unpack succeeded.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from e2e.cache import cache_root
from e2e.llama_build import _download_sdist, _extract
from e2e.toolchain import versions


def llama_cpp_python_version() -> str:
    return versions()["llama_cpp_python"]


def pinned_tree() -> Path:
    """vendor/llama.cpp of the pinned sdist (downloaded on first use)."""
    version = llama_cpp_python_version()
    home = cache_root() / f"llama_cpp_python-{version}-src"
    tree = home / "llama.cpp"
    if (home / ".complete").exists():
        return tree
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="llama-tree-") as work:
        source = _extract(_download_sdist(version, Path(work)), Path(work))
        shutil.copytree(source, tree, symlinks=True)
    (home / ".complete").write_text(f"llama-cpp-python {version}\n")
    return tree


def architecture_names(tree: Path) -> list[str]:
    """LLM_ARCH_NAMES of src/llama-arch.cpp, in the file's order."""
    source = (tree / "src" / "llama-arch.cpp").read_text()
    start = source.index("LLM_ARCH_NAMES = {")
    table = source[start:source.index("};", start)]
    return re.findall(r'\{\s*LLM_ARCH_\w+,\s*"([^"]+)"\s*\}', table)
