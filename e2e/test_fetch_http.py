"""`glm-operator fetch` against real HTTP(S) servers: TLS, Range/resume, retries, failures, Hub.

No cluster needed; each test starts its own server on a free port.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.fetch_helpers import (
    FetchRun,
    SafetensorsModel,
    folder_digest,
    run_fetch,
    sha256_of,
    write_safetensors_model,
    write_served_gguf,
)
from e2e.fetch_servers import (
    ModelFileServer,
    hub_commit,
    self_signed_certificate,
    serve,
    tls_server_context,
)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_served_gguf(tmp_path_factory.mktemp("served") / "glm-4-9b.Q4_K_M.gguf")


@pytest.fixture
def http_server(model: Path) -> Iterator[ModelFileServer]:
    with serve(model.parent) as server:
        yield server


def _gets(server: ModelFileServer, path: str) -> list[str | None]:
    return [rng for method, p, rng in server.requests if method == "GET" and p == path]


def test_https_with_self_signed_certificate(model: Path, tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    with serve(model.parent, tls_server_context(cert, key)) as server:
        url = f"{server.url}/{model.name}"
        untrusted = run_fetch("--source", url, "--dest", str(tmp_path / "c1"), "--max-attempts",
                              "2")
        assert untrusted.code == 5, untrusted.log
        assert "TLS certificate not trusted" in untrusted.log
        ok = run_fetch("--source", url, "--dest", str(tmp_path / "c2"), "--ca-bundle", str(cert),
                       "--sha256", sha256_of(model), "--architecture", "glm4")
    assert ok.code == 0, ok.log
    assert sha256_of(tmp_path / "c2" / model.name) == sha256_of(model)
    assert list((tmp_path / "c2").iterdir()) == [tmp_path / "c2" / model.name]


def test_plain_http_needs_allow_http(http_server: ModelFileServer, model: Path,
                                     tmp_path: Path) -> None:
    run = run_fetch("--source", f"{http_server.url}/{model.name}", "--dest", str(tmp_path))
    assert run.code == 2 and "plain http:// is refused" in run.log
    assert http_server.requests == []


def test_resumes_with_range_after_a_dropped_connection(http_server: ModelFileServer,
                                                       model: Path, tmp_path: Path) -> None:
    path = f"/{model.name}"
    http_server.drop_after[path] = 1_000_000
    run = run_fetch("--allow-http", "--source", http_server.url + path, "--dest", str(tmp_path),
                    "--sha256", sha256_of(model), "--architecture", "glm4")
    assert run.code == 0, run.log
    assert _gets(http_server, path) == [None, "bytes=1000000-"]
    assert "retrying" in run.log and "%" in run.log  # the retry and the progress are logged
    assert sha256_of(tmp_path / model.name) == sha256_of(model)


def test_resumes_a_partial_left_by_a_killed_job(http_server: ModelFileServer, model: Path,
                                                tmp_path: Path) -> None:
    (tmp_path / (model.name + ".partial")).write_bytes(model.read_bytes()[:1_500_000])
    run = run_fetch("--allow-http", "--source", f"{http_server.url}/{model.name}",
                    "--dest", str(tmp_path), "--sha256", sha256_of(model))
    assert run.code == 0, run.log
    assert _gets(http_server, f"/{model.name}") == ["bytes=1500000-"]
    assert sha256_of(tmp_path / model.name) == sha256_of(model)
    assert not (tmp_path / (model.name + ".partial")).exists()


def test_server_ignoring_range_restarts_cleanly(model: Path, tmp_path: Path) -> None:
    # python's SimpleHTTPRequestHandler answers every Range request with the whole file (200).
    proc = subprocess.Popen(["python3", "-m", "http.server", "0", "--bind", "127.0.0.1",
                             "--directory", str(model.parent)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().split("port ")[1].split(" ")[0]
        (tmp_path / (model.name + ".partial")).write_bytes(b"stale bytes from another file")
        run = run_fetch("--allow-http", "--source", f"http://127.0.0.1:{port}/{model.name}",
                        "--dest", str(tmp_path), "--sha256", sha256_of(model))
    finally:
        proc.terminate()
        proc.wait(5)
    assert run.code == 0, run.log
    assert "ignored the Range request" in run.log
    assert sha256_of(tmp_path / model.name) == sha256_of(model)


def test_retries_server_errors_with_backoff(http_server: ModelFileServer, model: Path,
                                            tmp_path: Path) -> None:
    path = f"/{model.name}"
    http_server.fail_next[path] = [503, 502]
    run = run_fetch("--allow-http", "--source", http_server.url + path, "--dest", str(tmp_path))
    assert run.code == 0, run.log
    assert len(_gets(http_server, path)) == 3
    assert "retrying in 0.1s" in run.log  # the second delay doubled the first (0.05)


def test_gives_up_when_the_server_keeps_failing(http_server: ModelFileServer, model: Path,
                                                tmp_path: Path) -> None:
    path = f"/{model.name}"
    http_server.fail_next[path] = [500] * 10
    run = run_fetch("--allow-http", "--source", http_server.url + path, "--dest", str(tmp_path),
                    "--max-attempts", "3")
    assert run.code == 5, run.log
    assert "giving up after 3 attempts" in run.log
    assert len(_gets(http_server, path)) == 3


def test_checksum_mismatch_leaves_nothing(http_server: ModelFileServer, model: Path,
                                          tmp_path: Path) -> None:
    run = run_fetch("--allow-http", "--source", f"{http_server.url}/{model.name}",
                    "--dest", str(tmp_path), "--sha256", "ab" * 32)
    assert run.code == 7, run.log
    assert "ChecksumMismatch" in run.log and sha256_of(model) in run.log
    assert list(tmp_path.iterdir()) == []


def test_wrong_architecture(http_server: ModelFileServer, model: Path, tmp_path: Path) -> None:
    run = run_fetch("--allow-http", "--source", f"{http_server.url}/{model.name}",
                    "--dest", str(tmp_path), "--architecture", "glm4moe")
    assert run.code == 8, run.log
    assert "general.architecture='glm4', spec.architecture expects 'glm4moe'" in run.log
    assert list(tmp_path.iterdir()) == []


def test_not_found(http_server: ModelFileServer, tmp_path: Path) -> None:
    run = run_fetch("--allow-http", "--source", f"{http_server.url}/missing.gguf",
                    "--dest", str(tmp_path))
    assert run.code == 3, run.log
    assert "HTTP 404" in run.log and "SourceNotFound" in run.log
    assert len(http_server.requests) == 1  # a 404 is not retried


@pytest.mark.parametrize(("token", "code"), [(None, 401), ("wrong", 403)])
def test_auth_failures(http_server: ModelFileServer, model: Path, tmp_path: Path,
                       token: str | None, code: int) -> None:
    http_server.required_token = "right"
    env = {"AUTHORIZATION": f"Bearer {token}"} if token else {}
    run = run_fetch("--allow-http", "--source", f"{http_server.url}/{model.name}",
                    "--dest", str(tmp_path), env=env)
    assert run.code == 4, run.log
    assert f"HTTP {code}" in run.log and "credentialsSecret" in run.log
    assert "wrong" not in run.log  # the token itself is never logged
    ok = run_fetch("--allow-http", "--source", f"{http_server.url}/{model.name}",
                   "--dest", str(tmp_path), env={"GLM_FETCH_BEARER_TOKEN": "right"})
    assert ok.code == 0, ok.log


def test_hub_layout_with_endpoint_token_and_revision(model: Path, tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    (hub / "THUDM" / "GLM-4-GGUF" / "v1.0" / "q4").mkdir(parents=True)
    (hub / "THUDM" / "GLM-4-GGUF" / "v1.0" / "q4" / model.name).write_bytes(model.read_bytes())
    with serve(hub) as server:
        server.hub_layout = True
        server.required_token = "hf_test"
        env = {"HF_ENDPOINT": server.url, "HF_TOKEN": "hf_test"}
        uri = f"hf://THUDM/GLM-4-GGUF/q4/{model.name}?revision=v1.0"
        run = run_fetch("--allow-http", "--source", uri, "--dest", str(tmp_path / "c"),
                        "--sha256", sha256_of(model), "--architecture", "glm4", env=env)
        assert run.code == 0, run.log
        paths = [p for _, p, _ in server.requests]
        assert paths == [f"/THUDM/GLM-4-GGUF/resolve/v1.0/q4/{model.name}",
                         f"/cdn/THUDM/GLM-4-GGUF/v1.0/q4/{model.name}"]
        missing = run_fetch("--allow-http", "--source", uri.replace("v1.0", "v2.0"),
                            "--dest", str(tmp_path / "c2"), env=env)
        assert missing.code == 3, missing.log
        no_token = run_fetch("--allow-http", "--source", uri, "--dest", str(tmp_path / "c3"),
                             env={"HF_ENDPOINT": server.url})
        assert no_token.code == 4, no_token.log
    assert sha256_of(tmp_path / "c" / model.name) == sha256_of(model)


def test_pvc_source_is_a_mounted_path(model: Path, tmp_path: Path) -> None:
    (tmp_path / "mnt" / "models-claim" / "glm").mkdir(parents=True)
    (tmp_path / "mnt" / "models-claim" / "glm" / model.name).write_bytes(model.read_bytes())
    run = run_fetch("--source", f"pvc://models-claim/glm/{model.name}",
                    "--pvc-root", str(tmp_path / "mnt"), "--dest", str(tmp_path / "cache"),
                    "--sha256", sha256_of(model), "--architecture", "glm4")
    assert run.code == 0, run.log
    assert sha256_of(tmp_path / "cache" / model.name) == sha256_of(model)


@pytest.fixture
def tiny_volume(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB file system (tmpfs), so 'disk full' is the kernel's ENOSPC, not a stub."""
    mount = tmp_path / "volume"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_disk_full_is_refused_before_downloading(http_server: ModelFileServer, model: Path,
                                                 tiny_volume: Path) -> None:
    run = run_fetch("--allow-http", "--source", f"{http_server.url}/{model.name}",
                    "--dest", str(tiny_volume))
    assert run.code == 6, run.log
    assert "InsufficientSpace" in run.log and "free" in run.log
    assert list(tiny_volume.iterdir()) == []


def test_disk_full_while_writing(http_server: ModelFileServer, model: Path,
                                 tiny_volume: Path) -> None:
    # Without Content-Length the size is unknown up front: the kernel's ENOSPC must be caught.
    http_server.no_length.add(f"/{model.name}")
    run = run_fetch("--allow-http", "--source", f"{http_server.url}/{model.name}",
                    "--dest", str(tiny_volume))
    assert run.code == 6, run.log
    assert "filled up" in run.log
    assert not (tiny_volume / model.name).exists()


# ---------------------------------------------------------------- folders (safetensors)


@pytest.fixture(scope="module")
def st_model(tmp_path_factory: pytest.TempPathFactory) -> SafetensorsModel:
    return write_safetensors_model(tmp_path_factory.mktemp("st") / "GLM-tiny")


@pytest.fixture
def hub(st_model: SafetensorsModel, tmp_path: Path) -> Iterator[ModelFileServer]:
    root = tmp_path / "hub"
    shutil.copytree(st_model.folder, root / "zai-org" / "GLM-tiny" / "main")
    with serve(root) as server:
        server.hub_layout = True
        server.required_token = "hf_test"
        server.tree_page_size = 4  # 12 files and original/: four pages, linked by rel="next"
        yield server


def _hub_fetch(server: ModelFileServer, dest: Path, *extra: str,
               uri: str = "hf://zai-org/GLM-tiny?revision=main") -> FetchRun:
    return run_fetch("--allow-http", "--format", "safetensors", "--source", uri,
                     "--dest", str(dest), *extra,
                     env={"HF_ENDPOINT": server.url, "HF_TOKEN": "hf_test"})


def _resolved(server: ModelFileServer) -> list[tuple[str, str | None]]:
    return [(p.rsplit("/resolve/", 1)[1], r) for m, p, r in server.requests
            if m == "GET" and "/resolve/" in p]


def test_hub_snapshot_lists_pins_downloads_and_verifies(
        hub: ModelFileServer, st_model: SafetensorsModel, tmp_path: Path) -> None:
    expected = folder_digest(st_model.folder, st_model.included)
    result_json = tmp_path / "result.json"
    run = _hub_fetch(hub, tmp_path / "cache", "--sha256", expected, "--architecture",
                     "glm4moe", "--result-json", str(result_json))
    assert run.code == 0, run.log
    folder = tmp_path / "cache" / "GLM-tiny"  # the renderer's model path: /models/<repo>
    fetched = sorted((p.relative_to(folder).as_posix() for p in folder.rglob("*")
                      if p.is_file()), key=str.encode)
    assert fetched == sorted([*st_model.included, ".glm-operator-manifest.json",
                              ".glm-operator.sha256sums"], key=str.encode)
    for name in st_model.included:
        assert (folder / name).read_bytes() == (st_model.folder / name).read_bytes()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["GLM-tiny"]
    # The documented coreutils pipeline gives the digest; sha256sum -c checks the folder.
    assert folder_digest(folder) == expected
    subprocess.run(["sha256sum", "--quiet", "-c", ".glm-operator.sha256sums"], cwd=folder,
                   check=True)
    result = json.loads(result_json.read_text())
    commit = hub_commit("zai-org", "GLM-tiny", "main")
    assert result["sha256"] == expected and result["revision"] == commit
    assert result["cachePath"] == "GLM-tiny" and result["files"] == len(st_model.included)
    assert result["sizeBytes"] == sum((st_model.folder / f).stat().st_size
                                      for f in st_model.included)
    assert result["facts"] == {
        "architecture": "glm4moe", "blockCount": 47, "nextnPredictLayers": 1,
        "embeddingLength": 4096, "headCount": 96, "headCountKv": 8, "keyLength": 128,
        "valueLength": 128, "contextLength": 131072, "expertCount": 128,
        "expertUsedCount": 8, "vocabSize": 151552, "parameterCount": st_model.parameters,
        "sizeBytes": result["sizeBytes"]}
    # Every file is read at the pinned commit, never at the moving branch name.
    resolved = _resolved(hub)
    assert sorted(p for p, _ in resolved) == sorted(f"{commit}/{f}" for f in st_model.included)
    tree_pages = [p for m, p, _ in hub.requests if "/tree/" in p]
    assert len(tree_pages) == 4
    assert "left out by the include patterns" in run.log and "pytorch_model.bin" in run.log

    hub.requests.clear()
    again = _hub_fetch(hub, tmp_path / "cache", "--sha256", expected, "--result-json",
                       str(result_json))
    assert again.code == 0, again.log
    assert json.loads(result_json.read_text())["fromCache"] is True
    assert hub.requests == []  # a verified cached folder needs no network


def test_hub_snapshot_resumes_one_file(hub: ModelFileServer, st_model: SafetensorsModel,
                                       tmp_path: Path) -> None:
    shard = "model-00001-of-00002.safetensors"
    partial = tmp_path / "cache" / "GLM-tiny.partial"
    partial.mkdir(parents=True)
    (partial / "config.json").write_bytes((st_model.folder / "config.json").read_bytes())
    (partial / (shard + ".partial")).write_bytes((st_model.folder / shard).read_bytes()[:300_000])
    (partial / "stale-from-another-revision.json").write_text("{}")
    result_json = tmp_path / "result.json"
    run = _hub_fetch(hub, tmp_path / "cache", "--result-json", str(result_json))
    assert run.code == 0, run.log
    resolved = dict(_resolved(hub))
    commit = hub_commit("zai-org", "GLM-tiny", "main")
    assert resolved[f"{commit}/{shard}"] == "bytes=300000-"
    assert f"{commit}/config.json" not in resolved  # already complete, re-hashed only
    assert json.loads(result_json.read_text())["resumedFiles"] == 1
    folder = tmp_path / "cache" / "GLM-tiny"
    assert (folder / shard).read_bytes() == (st_model.folder / shard).read_bytes()
    assert not (folder / "stale-from-another-revision.json").exists()
    assert not partial.exists()


def test_hub_snapshot_missing_file_fails_the_whole_snapshot(
        hub: ModelFileServer, st_model: SafetensorsModel, tmp_path: Path) -> None:
    hub.hub_missing.add("tokenizer.json")
    run = _hub_fetch(hub, tmp_path / "cache")
    assert run.code == 3, run.log
    assert "HTTP 404" in run.log and "tokenizer.json" in run.log
    assert not (tmp_path / "cache" / "GLM-tiny").exists()  # nothing under the final name
    kept = tmp_path / "cache" / "GLM-tiny.partial"
    assert (kept / "model-00001-of-00002.safetensors").is_file()  # the rest is kept...
    hub.hub_missing.clear()
    hub.requests.clear()
    again = _hub_fetch(hub, tmp_path / "cache")
    assert again.code == 0, again.log
    fetched_again = {p.rsplit("/", 1)[1] for p, _ in _resolved(hub)}
    assert "model-00001-of-00002.safetensors" not in fetched_again  # ...and not fetched again
    assert "tokenizer.json" in fetched_again
    assert (tmp_path / "cache" / "GLM-tiny" / "tokenizer.json").is_file()


def test_hub_snapshot_digest_mismatch_leaves_nothing(hub: ModelFileServer,
                                                     tmp_path: Path) -> None:
    run = _hub_fetch(hub, tmp_path / "cache", "--sha256", "ab" * 32)
    assert run.code == 7, run.log
    assert "snapshot digest is" in run.log and "ChecksumMismatch" in run.log
    assert list((tmp_path / "cache").iterdir()) == []


def test_hub_snapshot_checks_the_architecture(hub: ModelFileServer, tmp_path: Path) -> None:
    run = _hub_fetch(hub, tmp_path / "cache", "--architecture", "glm4")
    assert run.code == 8, run.log
    assert "config.json says glm4moe, Glm4MoeForCausalLM, glm4_moe" in run.log
    ok = _hub_fetch(hub, tmp_path / "cache2", "--architecture", "glm4_moe")
    assert ok.code == 0, ok.log


def test_hub_snapshot_tampered_file_fails_its_lfs_checksum(
        hub: ModelFileServer, st_model: SafetensorsModel, tmp_path: Path) -> None:
    # The listing says one sha256, the CDN serves other bytes of the same size.
    shard = "model-00002-of-00002.safetensors"
    listed = hub.root / "zai-org" / "GLM-tiny" / "main" / shard
    original = listed.read_bytes()
    hub.hub_lfs_override = {shard: hashlib.sha256(original[::-1]).hexdigest()}
    run = _hub_fetch(hub, tmp_path / "cache")
    assert run.code == 7, run.log
    assert shard in run.log
    assert not (tmp_path / "cache" / "GLM-tiny").exists()
    assert not (tmp_path / "cache" / "GLM-tiny.partial" / shard).exists()


@pytest.mark.parametrize(("uri", "code", "words"), [
    ("hf://zai-org/GLM-tiny?revision=v9", 3, "repository or revision not found"),
    ("hf://zai-org/nope", 3, "repository or revision not found"),
])
def test_hub_snapshot_unknown_repository_or_revision(hub: ModelFileServer, tmp_path: Path,
                                                     uri: str, code: int, words: str) -> None:
    run = _hub_fetch(hub, tmp_path / "cache", uri=uri)
    assert run.code == code, run.log
    assert words in run.log
    assert not (tmp_path / "cache" / uri.split("/")[3].split("?")[0]).exists()


def test_hub_snapshot_needs_the_token(hub: ModelFileServer, tmp_path: Path) -> None:
    run = run_fetch("--allow-http", "--source", "hf://zai-org/GLM-tiny", "--dest",
                    str(tmp_path / "c"), env={"HF_ENDPOINT": hub.url})
    assert run.code == 4, run.log
    assert "HTTP 401" in run.log


def test_folder_source_is_refused_for_gguf(tmp_path: Path) -> None:
    run = run_fetch("--format", "gguf", "--source", "hf://zai-org/GLM-tiny",
                    "--dest", str(tmp_path))
    assert run.code == 2 and "only format safetensors" in run.log
