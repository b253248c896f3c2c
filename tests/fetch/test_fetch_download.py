"""The download state machine over a real local file (pvc:// source): no network, no mocks."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest
from gguf_files import MakeGGUF
from glm_operator.fetch.download import FetchOptions, fetch_artifact
from glm_operator.fetch.errors import (
    ChecksumMismatch,
    InsufficientSpace,
    InvalidModelFile,
    SourceNotFound,
    WrongArchitecture,
)
from glm_operator.fetch.sources import LocalSource


def _source(path: Path) -> LocalSource:
    return LocalSource(path=path, display=f"pvc://claim/{path.name}", filename=path.name)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_copies_verifies_and_reports_facts(make_gguf: MakeGGUF, tmp_path: Path) -> None:
    model = make_gguf("glm4moe")
    dest = tmp_path / "cache"
    result = fetch_artifact(_source(model), dest, "m.gguf",
                            FetchOptions(expected_sha256=_sha(model),
                                         expected_architecture="glm4moe"))
    assert result.path == dest / "m.gguf"
    assert result.path.read_bytes() == model.read_bytes()
    assert result.sha256 == _sha(model) and result.size_bytes == model.stat().st_size
    assert result.gguf is not None and result.gguf.nextn_predict_layers == 1
    assert not result.from_cache
    assert sorted(p.name for p in dest.iterdir()) == ["m.gguf"]


def test_second_run_uses_the_cache(make_gguf: MakeGGUF, tmp_path: Path) -> None:
    model = make_gguf("glm4")
    options = FetchOptions(expected_sha256=_sha(model))
    fetch_artifact(_source(model), tmp_path / "c", "m.gguf", options)
    model.unlink()  # the source is gone: only the cache can answer
    again = fetch_artifact(_source(model), tmp_path / "c", "m.gguf", options)
    assert again.from_cache and again.sha256 == options.expected_sha256


def test_corrupt_cache_is_downloaded_again(make_gguf: MakeGGUF, tmp_path: Path) -> None:
    model = make_gguf("glm4")
    dest = tmp_path / "c"
    dest.mkdir()
    (dest / "m.gguf").write_bytes(b"garbage")
    result = fetch_artifact(_source(model), dest, "m.gguf",
                            FetchOptions(expected_sha256=_sha(model)))
    assert not result.from_cache and _sha(result.path) == _sha(model)


def test_resumes_a_partial_file_and_hashes_the_whole(make_gguf: MakeGGUF, tmp_path: Path) -> None:
    model = make_gguf("glm4")
    data = model.read_bytes()
    dest = tmp_path / "c"
    dest.mkdir()
    (dest / "m.gguf.partial").write_bytes(data[:1000])
    result = fetch_artifact(_source(model), dest, "m.gguf",
                            FetchOptions(expected_sha256=_sha(model)))
    assert result.resumed_from_bytes == 1000
    assert result.path.read_bytes() == data


def test_checksum_mismatch_leaves_no_file(make_gguf: MakeGGUF, tmp_path: Path) -> None:
    model = make_gguf("glm4")
    dest = tmp_path / "c"
    with pytest.raises(ChecksumMismatch, match=r"spec.sha256 says 0{64}") as info:
        fetch_artifact(_source(model), dest, "m.gguf", FetchOptions(expected_sha256="0" * 64))
    assert _sha(model) in str(info.value)
    assert list(dest.iterdir()) == []


def test_wrong_architecture_leaves_no_file(make_gguf: MakeGGUF, tmp_path: Path) -> None:
    model = make_gguf("llama")
    dest = tmp_path / "c"
    with pytest.raises(WrongArchitecture, match=r"architecture='llama'.*expects 'glm4'"):
        fetch_artifact(_source(model), dest, "m.gguf", FetchOptions(expected_architecture="glm4"))
    assert list(dest.iterdir()) == []


def test_not_a_gguf(tmp_path: Path) -> None:
    bogus = tmp_path / "m.gguf"
    bogus.write_bytes(b"<html>login page</html>")
    with pytest.raises(InvalidModelFile, match="not a GGUF file"):
        fetch_artifact(_source(bogus), tmp_path / "c", "m.gguf", FetchOptions())


def test_safetensors_skip_the_header_check(tmp_path: Path) -> None:
    blob = tmp_path / "model.safetensors"
    blob.write_bytes(b"x" * 100)
    result = fetch_artifact(_source(blob), tmp_path / "c", blob.name,
                            FetchOptions(parse_gguf=False))
    assert result.gguf is None and result.size_bytes == 100


def test_missing_source(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFound, match="no such file"):
        fetch_artifact(_source(tmp_path / "nope.gguf"), tmp_path / "c", "nope.gguf",
                       FetchOptions())


def test_free_space_check_before_writing(make_gguf: MakeGGUF, tmp_path: Path) -> None:
    model = make_gguf("glm4")
    dest = tmp_path / "c"
    size = model.stat().st_size
    options = FetchOptions(reserve_bytes=1000, free_bytes=lambda _: size + 999)
    with pytest.raises(InsufficientSpace, match=r"plus a reserve of .* free") as info:
        fetch_artifact(_source(model), dest, "m.gguf", options)
    assert "spec.cache" in str(info.value)
    assert list(dest.iterdir()) == []
    # with exactly enough room it goes through
    ok = FetchOptions(reserve_bytes=1000, free_bytes=lambda _: size + 1000)
    assert fetch_artifact(_source(model), dest, "m.gguf", ok).size_bytes == size


def test_progress_is_logged(make_gguf: MakeGGUF, tmp_path: Path,
                            caplog: pytest.LogCaptureFixture) -> None:
    model = make_gguf("glm4")
    with caplog.at_level(logging.INFO, logger="glm_operator.fetch"):
        fetch_artifact(_source(model), tmp_path / "c", "m.gguf",
                       FetchOptions(progress_interval_s=0))
    assert any("100.0%" in r.getMessage() for r in caplog.records)
    assert any("verified and stored" in r.getMessage() for r in caplog.records)


def test_a_second_fetch_waits_for_the_first(make_gguf: MakeGGUF, tmp_path: Path) -> None:
    import fcntl
    import threading

    model = make_gguf("glm4")
    dest = tmp_path / "c"
    dest.mkdir()
    results: list[object] = []
    with (dest / "m.gguf.lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # "another pod" is fetching
        worker = threading.Thread(target=lambda: results.append(
            fetch_artifact(_source(model), dest, "m.gguf", FetchOptions())))
        worker.start()
        worker.join(1.0)
        assert worker.is_alive() and not (dest / "m.gguf").exists()
        (dest / "m.gguf.lock").unlink()  # what the holder does when it finishes
    worker.join(10)
    assert len(results) == 1 and (dest / "m.gguf").exists()
    assert sorted(p.name for p in dest.iterdir()) == ["m.gguf"]
