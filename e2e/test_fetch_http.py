"""`glm-operator fetch` against real HTTP(S) servers: TLS, Range/resume, retries, failures, Hub.

No cluster needed; each test starts its own server on a free port.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.fetch_helpers import run_fetch, sha256_of, write_served_gguf
from e2e.fetch_servers import ModelFileServer, self_signed_certificate, serve, tls_server_context


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
