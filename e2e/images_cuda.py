"""The CUDA llama.cpp image's test build (`python -m e2e.images build-cuda`; docs/images.md).

Built from source inside buildah: the llama-cpp-python sdist and NVIDIA's CUDA wheels
(runtime-images/llamacpp/cuda-wheels.txt) downloaded on the host into the cache and passed in
the build context (INPUTS=inputs-context), for one SM version without flash-attention kernels
(CUDA_TEST_BUILD_ARGS), two jobs at nice 19. Tagged `<rendered name>-test-sm90-nofa`: it must
not serve. Apart from e2e/images.py because nothing else shares its 35-minute compile.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from glm_operator.planning.accelerators import runtime_images

from e2e import toolchain
from e2e.images import (
    IMAGES_DIR,
    Built,
    ImageSpec,
    Store,
    _digest,
    build_image,
    ensure_base,
    file_sha256,
    log,
    reuse,
    store_free_run,
)

# The CUDA llama.cpp image as the tests build it: one SM version (Hopper: the H200 of
# planning/accelerators.py, the kind of machine a GPU check gets) and no flash-attention kernels
# (GGML_CUDA_FA=OFF compiles them as stubs), two compile jobs, the sdist and wheels from the
# build context. docs/images.md has what this costs and saves.
CUDA_TEST_BUILD_ARGS: tuple[tuple[str, str], ...] = (
    ("INPUTS", "inputs-context"),
    ("CUDA_ARCHITECTURES", "90"),
    ("GGML_CUDA_FA", "OFF"),
    ("BUILD_JOBS", "2"),
)
CUDA_DIR = IMAGES_DIR / "llamacpp"
CUDA_WHEELS_FILE = CUDA_DIR / "cuda-wheels.txt"
# Besides the Dockerfile, what the CUDA image's build reads from runtime-images/llamacpp.
CUDA_CONTEXT_FILES = ("cuda-toolkit.sh", "cuda-wheels.txt")
CUDA_BUILD_TIMEOUT = 3 * 3600


def llama_cuda_spec() -> ImageSpec:
    """Tagged apart from what the operator renders: this build must not serve (no FA kernels,
    one architecture), so no pod spec may pick it up by its release name."""
    repository, version = runtime_images()["llamacpp-cuda"].rsplit(":", 1)
    return ImageSpec("llamacpp-cuda", CUDA_DIR / "Dockerfile.cuda",
                     f"{repository}:{version}-test-sm90-nofa", target="runtime",
                     build_args=CUDA_TEST_BUILD_ARGS)


def _cuda_downloads_folder() -> Path:
    version = toolchain.versions()["llama_cpp_python"]
    return toolchain.cache_root() / (
        f"llamacpp-cuda-downloads-{_digest(version, CUDA_WHEELS_FILE.read_bytes())}")


def cuda_downloads() -> Path:
    """The llama-cpp-python sdist and the CUDA wheels (cuda-wheels.txt, checked against its
    hashes by pip) downloaded on the host into the toolchain cache: downloads/sdist/*.tar.gz
    and downloads/wheels/*.whl, as the image's `inputs-context` stage reads them."""
    version = toolchain.versions()["llama_cpp_python"]
    folder = _cuda_downloads_folder()
    if (folder / toolchain.COMPLETE_MARKER).exists():
        return folder / "downloads"
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    log(f"downloading llama-cpp-python {version} and the CUDA wheels into {folder}")
    store_free_run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--no-binary", ":all:", "--dest", str(staging / "downloads" / "sdist"),
                    f"llama-cpp-python=={version}"], "pip download (llama-cpp-python sdist)")
    store_free_run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--only-binary", ":all:", "--require-hashes",
                    "--dest", str(staging / "downloads" / "wheels"),
                    "-r", str(CUDA_WHEELS_FILE)], "pip download (CUDA wheels)", timeout=3600)
    (staging / toolchain.COMPLETE_MARKER).write_text(f"{version}\n")
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return folder / "downloads"


def _cuda_context(work: Path, downloads: Path) -> Path:
    """The Dockerfile, cuda-toolkit.sh, cuda-wheels.txt and downloads/ (hard links into the
    cache where it shares a file system, else copies)."""
    context = work / "llamacpp-cuda"
    context.mkdir(parents=True)
    shutil.copy2(llama_cuda_spec().dockerfile, context / "Dockerfile")
    for name in CUDA_CONTEXT_FILES:
        shutil.copy2(CUDA_DIR / name, context / name)
    for source in sorted(downloads.rglob("*")):
        if not source.is_file():
            continue
        target = context / "downloads" / source.relative_to(downloads)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)
    return context


def _cuda_inputs(downloads: Path) -> list[tuple[str, bytes]]:
    """The image's inputs besides the Dockerfile: its scripts, and the sdist and wheels by
    name and SHA-256 (cuda-wheels.txt pins the wheels' hashes; hashing 500 MB of wheels again
    on every run would only repeat pip's check)."""
    files = [(name, (CUDA_DIR / name).read_bytes()) for name in CUDA_CONTEXT_FILES]
    files += [(f"downloads/{p.relative_to(downloads)}", file_sha256(p).encode())
              for p in sorted((downloads / "sdist").glob("*"))]
    files += [(f"downloads/{p.relative_to(downloads)}", b"")
              for p in sorted((downloads / "wheels").glob("*.whl"))]
    return files


def cached_cuda() -> Built | None:
    """The CUDA image's test build if one from the current inputs is stored; builds and
    downloads nothing (the base excepted, which takes minutes, not the compile's hour)."""
    folder = _cuda_downloads_folder()
    if not (folder / toolchain.COMPLETE_MARKER).exists():
        return None
    store = Store.default()
    store.prepare()
    spec = llama_cuda_spec()
    with store.locked():
        base_id = store.image_id(ensure_base(store).reference)
        return reuse(store, spec, spec.inputs_hash(base_id, _cuda_inputs(folder / "downloads")))


def build_cuda() -> Built:
    """The CUDA llama.cpp image's test build (CUDA_TEST_BUILD_ARGS), unless its inputs are
    unchanged. Under a lock of its own: the compile (34 min here) must not hold back
    the other images' builds on the same storage."""
    store = Store.default()
    store.prepare()
    spec = llama_cuda_spec()
    with store.locked("build-cuda.lock"):
        downloads = cuda_downloads()
        with store.locked():
            base = ensure_base(store)
            base_id = store.image_id(base.reference)
            inputs = spec.inputs_hash(base_id, _cuda_inputs(downloads))
            cached = reuse(store, spec, inputs)
        if cached is not None:
            return cached
        with tempfile.TemporaryDirectory(prefix="glm-images-cuda-",
                                         dir=downloads.parent) as tmp:
            return build_image(store, spec, _cuda_context(Path(tmp), downloads),
                               base.reference, inputs, timeout=CUDA_BUILD_TIMEOUT)
