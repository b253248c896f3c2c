from __future__ import annotations

from pathlib import Path

import pytest
from glm_operator.fetch.errors import InvalidSourceURI
from glm_operator.fetch.s3_signing import S3Credentials
from glm_operator.fetch.sources import HttpSource, LocalSource, SourceSettings, parse_source


def test_https_keeps_url_and_file_name() -> None:
    source = parse_source("https://models.example/glm/glm-4-9b.Q4_K_M.gguf", SourceSettings())
    assert isinstance(source, HttpSource)
    assert source.url == "https://models.example/glm/glm-4-9b.Q4_K_M.gguf"
    assert source.filename == "glm-4-9b.Q4_K_M.gguf"
    assert source.request_headers("GET", {}) == {}


def test_https_bearer_token_from_environment() -> None:
    settings = SourceSettings.from_environment({"GLM_FETCH_BEARER_TOKEN": "s3cret"})
    source = parse_source("https://h/m.gguf", settings)
    assert isinstance(source, HttpSource)
    assert source.request_headers("GET", {})["Authorization"] == "Bearer s3cret"
    assert "s3cret" not in repr(source)


def test_https_authorization_header_from_the_secret() -> None:
    # The credentialsSecret's AUTHORIZATION key is the whole header value (Basic auth too).
    settings = SourceSettings.from_environment({"AUTHORIZATION": "Basic dXNlcjpwdw=="})
    source = parse_source("https://h/m.gguf", settings)
    assert isinstance(source, HttpSource)
    assert source.request_headers("GET", {})["Authorization"] == "Basic dXNlcjpwdw=="


def test_plain_http_refused_unless_allowed() -> None:
    with pytest.raises(InvalidSourceURI, match=r"spec.source.uri .*plain http"):
        parse_source("http://h/m.gguf", SourceSettings())
    assert isinstance(parse_source("http://h/m.gguf", SourceSettings(allow_http=True)),
                      HttpSource)


def test_hf_resolve_url_with_revision_endpoint_and_token() -> None:
    settings = SourceSettings.from_environment(
        {"HF_ENDPOINT": "https://hub.local:8443/", "HF_TOKEN": "hf_abc"})
    source = parse_source("hf://THUDM/GLM-4-GGUF/q4/glm 4.gguf?revision=v1.0", settings)
    assert isinstance(source, HttpSource)
    assert source.url == "https://hub.local:8443/THUDM/GLM-4-GGUF/resolve/v1.0/q4/glm%204.gguf"
    assert source.filename == "glm 4.gguf"
    assert source.request_headers("GET", {})["Authorization"] == "Bearer hf_abc"


def test_hf_defaults_to_main_and_the_public_hub() -> None:
    source = parse_source("hf://org/repo/file.gguf", SourceSettings())
    assert isinstance(source, HttpSource)
    assert source.url == "https://huggingface.co/org/repo/resolve/main/file.gguf"


def test_s3_path_style_and_signed() -> None:
    settings = SourceSettings.from_environment({
        "AWS_ENDPOINT_URL": "https://minio.local:9000", "AWS_ACCESS_KEY_ID": "AK",
        "AWS_SECRET_ACCESS_KEY": "SK", "AWS_REGION": "eu-west-1"})
    source = parse_source("s3://models/glm/m.gguf", settings)
    assert isinstance(source, HttpSource)
    assert source.url == "https://minio.local:9000/models/glm/m.gguf"
    headers = source.request_headers("GET", {"Range": "bytes=5-"})
    assert headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AK/")
    assert "/eu-west-1/s3/aws4_request" in headers["Authorization"]
    assert "range" in headers["Authorization"]


def test_s3_without_credentials_is_anonymous() -> None:
    source = parse_source("s3://public-bucket/m.gguf", SourceSettings(s3_region="us-west-2"))
    assert isinstance(source, HttpSource)
    assert source.url == "https://s3.us-west-2.amazonaws.com/public-bucket/m.gguf"
    assert "Authorization" not in source.request_headers("GET", {})


def test_pvc_maps_to_the_mounted_claim() -> None:
    source = parse_source("pvc://models-claim/glm/m.gguf", SourceSettings(pvc_root=Path("/mnt")))
    assert isinstance(source, LocalSource)
    assert source.path == Path("/mnt/models-claim/glm/m.gguf")


def test_credentials_never_in_repr() -> None:
    assert "SK" not in repr(S3Credentials("AK", "SK"))


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("ftp://h/m.gguf", "scheme must be one of"),
        ("models/m.gguf", "no scheme given"),
        ("https://h/", "must end in a file name"),
        ("https:///m.gguf", "no host"),
        ("s3:///key", "no bucket"),
        ("s3://b/dir/", "must name a file"),
        ("hf://org", "expected hf://org/repo/path/to/file"),
        ("hf://org/repo/f.gguf?rev=1", "unknown query parameter"),
        ("pvc://claim/../etc/passwd", "no '..'"),
        ("pvc:///m.gguf", "no claim name"),
    ],
)
def test_bad_uris_name_the_field(uri: str, message: str) -> None:
    with pytest.raises(InvalidSourceURI, match=message) as info:
        parse_source(uri, SourceSettings())
    assert str(info.value).startswith("spec.source.uri")
