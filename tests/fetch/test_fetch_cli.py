from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pytest
from gguf_files import MakeGGUF
from glm_operator.cli import main
from glm_operator.fetch.cli import parse_size


def test_parse_size() -> None:
    assert parse_size("512Mi") == 512 * 2**20
    assert parse_size("2G") == 2 * 10**9
    assert parse_size("100") == 100
    with pytest.raises(argparse.ArgumentTypeError, match="not a size"):
        parse_size("2 GB")


def test_fetch_from_pvc_writes_result_json(make_gguf: MakeGGUF, tmp_path: Path) -> None:
    model = make_gguf("glm4", name="glm.gguf")
    claim_root = tmp_path / "mnt"
    (claim_root / "models").mkdir(parents=True)
    model.rename(claim_root / "models" / "glm.gguf")
    sha = hashlib.sha256((claim_root / "models" / "glm.gguf").read_bytes()).hexdigest()
    out = tmp_path / "result.json"
    code = main(["fetch", "--source", "pvc://models/glm.gguf", "--pvc-root", str(claim_root),
                 "--dest", str(tmp_path / "cache"), "--sha256", sha, "--architecture", "glm4",
                 "--result-json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["sha256"] == sha and result["gguf"]["architecture"] == "glm4"
    assert result["gguf"]["blockCount"] == 40 and result["cachePath"] == "glm.gguf"


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["--source", "ftp://x/y.gguf"], 2),
        (["--source", "pvc://models/missing.gguf"], 3),
    ],
)
def test_exit_codes(argv: list[str], code: int, tmp_path: Path) -> None:
    assert main(["fetch", *argv, "--dest", str(tmp_path), "--pvc-root", str(tmp_path)]) == code


def test_wrong_architecture_exit_code(make_gguf: MakeGGUF, tmp_path: Path) -> None:
    make_gguf("llama", name="m.gguf")
    assert main(["fetch", "--source", f"pvc://{tmp_path.name}/m.gguf",
                 "--pvc-root", str(tmp_path.parent), "--dest", str(tmp_path / "c"),
                 "--architecture", "glm4"]) == 8
    assert not (tmp_path / "c" / "m.gguf").exists()
