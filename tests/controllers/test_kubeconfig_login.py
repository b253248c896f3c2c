"""`glm-operator run --kubeconfig FILE` logs kopf in with that file, not only with KUBECONFIG."""

from __future__ import annotations

from pathlib import Path

import yaml
from glm_operator.kube.client import kubeconfig_connection


def _kubeconfig(path: Path, user: dict[str, str]) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://10.0.0.1:6443",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }))
    return path


def test_token_kubeconfig(tmp_path: Path) -> None:
    info = kubeconfig_connection(str(_kubeconfig(tmp_path / "config", {"token": "s3cret"})))
    assert info.server == "https://10.0.0.1:6443"
    assert (info.scheme, info.token) == ("Bearer", "s3cret")
    assert info.insecure is True


def test_client_certificate_kubeconfig(tmp_path: Path) -> None:
    cert, key = tmp_path / "admin.crt", tmp_path / "admin.key"
    cert.write_text("cert"), key.write_text("key")
    info = kubeconfig_connection(str(_kubeconfig(
        tmp_path / "config", {"client-certificate": str(cert), "client-key": str(key)})))
    assert (info.certificate_path, info.private_key_path) == (str(cert), str(key))
    assert info.token is None
