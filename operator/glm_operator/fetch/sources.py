"""Turn a ModelVersion's `source.uri` into something the downloader can read from an offset.

    https://host/path/model.gguf         GET with Range; http:// only with allow_http
    s3://bucket/key                      GET with Range, SigV4-signed (path-style addressing)
    hf://org/repo/path/file?revision=r   {endpoint}/{org}/{repo}/resolve/{r}/{path/file}
    pvc://claim/path/file                a file under {pvc_root}/{claim}/ (the claim is mounted)

Directories (safetensors snapshots, see `parse_directory_source` and docs/fetch.md):

    hf://org/repo[?revision=r]           every file of the repository at that revision
    s3://bucket/prefix/                  every object under the prefix (note the final '/')

Credentials never appear in the URI; they come from the environment the Job gets from the
ModelVersion's `credentialsSecret`:

    HF_TOKEN                                     hf://   (Authorization: Bearer)
    AUTHORIZATION                                https:// (the whole header value, e.g.
                                                 "Bearer x" or "Basic y"), optional
    GLM_FETCH_BEARER_TOKEN                       https:// (Authorization: Bearer x), optional
    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,    s3://   (AWS_SESSION_TOKEN optional)
    AWS_SESSION_TOKEN
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

from glm_operator.fetch.errors import InvalidSourceURI
from glm_operator.fetch.s3_signing import S3Credentials, object_path, sign_request

FIELD = "spec.source.uri"
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
DEFAULT_PVC_ROOT = "/mnt/pvc"

# (method, url, headers) -> headers to send; S3 signs each request with a fresh date.
RequestSigner = Callable[[str, str, Mapping[str, str]], dict[str, str]]


@dataclass(frozen=True)
class SourceSettings:
    """Where and as whom to fetch; defaults come from the environment (see `from_environment`)."""

    allow_http: bool = False
    hf_endpoint: str = DEFAULT_HF_ENDPOINT
    hf_token: str | None = None
    http_authorization: str | None = None  # the Authorization header value for https://
    s3_endpoint: str | None = None
    s3_region: str = "us-east-1"
    s3_credentials: S3Credentials | None = None
    pvc_root: Path = Path(DEFAULT_PVC_ROOT)

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None, **overrides: object) -> (
            SourceSettings):
        environ = os.environ if env is None else env
        access, secret = environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY")
        values: dict[str, object] = {
            "hf_endpoint": environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT,
            "hf_token": environ.get("HF_TOKEN") or None,
            "http_authorization": environ.get("AUTHORIZATION") or (
                f"Bearer {environ['GLM_FETCH_BEARER_TOKEN']}"
                if environ.get("GLM_FETCH_BEARER_TOKEN") else None),
            "s3_endpoint": environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL"),
            "s3_region": environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
            or "us-east-1",
            "s3_credentials": S3Credentials(access, secret, environ.get("AWS_SESSION_TOKEN"))
            if access and secret else None,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class HttpSource:
    url: str
    display: str
    filename: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    signer: RequestSigner | None = field(default=None, repr=False)

    def request_headers(self, method: str, extra: Mapping[str, str]) -> dict[str, str]:
        headers = {**self.headers, **extra}
        return self.signer(method, self.url, headers) if self.signer else headers


@dataclass(frozen=True)
class LocalSource:
    path: Path
    display: str
    filename: str


Source = HttpSource | LocalSource


def _bad(uri: str, why: str) -> InvalidSourceURI:
    return InvalidSourceURI(f"{FIELD} {uri!r}: {why}")


def _clean_relative_path(uri: str, path: str, what: str) -> str:
    if not path or path.endswith("/"):
        raise _bad(uri, f"{what} must name a file")
    normal = posixpath.normpath(path)
    if normal.startswith("..") or normal.startswith("/") or "/../" in f"/{normal}/":
        raise _bad(uri, f"{what} must stay inside its root (no '..')")
    return normal


def parse_source(uri: str, settings: SourceSettings) -> Source:
    """Resolve `uri` to a source; raise InvalidSourceURI naming the field for anything else."""
    parts = urlsplit(uri.strip())
    scheme = parts.scheme.lower()
    if scheme in ("https", "http"):
        if scheme == "http" and not settings.allow_http:
            raise _bad(uri, "plain http:// is refused; use https:// or allow http explicitly")
        if not parts.netloc:
            raise _bad(uri, "no host")
        name = posixpath.basename(parts.path)
        if not name:
            raise _bad(uri, "the path must end in a file name")
        headers = {"Authorization": settings.http_authorization} \
            if settings.http_authorization else {}
        display = f"{scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path}"
        return HttpSource(url=uri.strip(), display=display, filename=name, headers=headers)
    if scheme == "s3":
        bucket, key = parts.netloc, parts.path.lstrip("/")
        if not bucket:
            raise _bad(uri, "no bucket (expected s3://bucket/key)")
        key = _clean_relative_path(uri, key, "the object key")
        return _s3_source(uri, bucket, key, settings)
    if scheme == "hf":
        return _hf_source(uri, parts.netloc, parts.path, parts.query, settings)
    if scheme == "pvc":
        claim = parts.netloc
        if not claim:
            raise _bad(uri, "no claim name (expected pvc://claim/path)")
        relative = _clean_relative_path(uri, parts.path.lstrip("/"), "the path in the claim")
        path = settings.pvc_root / claim / relative
        return LocalSource(path=path, display=f"pvc://{claim}/{relative}",
                           filename=posixpath.basename(relative))
    raise _bad(uri, "scheme must be one of https, s3, hf, pvc" + (
        "" if scheme else " (no scheme given)"))


def _s3_source(uri: str, bucket: str, key: str, settings: SourceSettings, query: str = "") -> (
        HttpSource):
    if settings.s3_endpoint:
        endpoint = settings.s3_endpoint.rstrip("/")
        if endpoint.startswith("http://") and not settings.allow_http:
            raise _bad(uri, f"S3 endpoint {endpoint} is plain http; allow http explicitly")
        url = endpoint + object_path(bucket, key)
    else:
        url = f"https://s3.{settings.s3_region}.amazonaws.com{object_path(bucket, key)}"
    if query:
        url += "?" + query
    credentials, region = settings.s3_credentials, settings.s3_region

    def signer(method: str, target: str, headers: Mapping[str, str]) -> dict[str, str]:
        if credentials is None:  # public bucket: anonymous request
            return dict(headers)
        return sign_request(method, target, headers, credentials, region)

    return HttpSource(url=url, display=f"s3://{bucket}/{key}", filename=posixpath.basename(key),
                      signer=signer)


def _hf_source(uri: str, org: str, path: str, query: str, settings: SourceSettings) -> HttpSource:
    segments = [s for s in path.split("/") if s]
    if not org or len(segments) < 2:
        raise _bad(uri, "expected hf://org/repo/path/to/file[?revision=...]")
    repo, file_path = segments[0], _clean_relative_path(uri, "/".join(segments[1:]), "the file")
    revisions = parse_qs(query).get("revision", ["main"])
    revision = revisions[0] or "main"
    unknown = set(parse_qs(query)) - {"revision"}
    if unknown:
        raise _bad(uri, f"unknown query parameter(s) {sorted(unknown)}; only revision is allowed")
    return hf_file_source(uri, org, repo, revision, file_path, settings)


def _hf_endpoint(uri: str, settings: SourceSettings) -> str:
    endpoint = settings.hf_endpoint.rstrip("/")
    if endpoint.startswith("http://") and not settings.allow_http:
        raise _bad(uri, f"Hub endpoint {endpoint} is plain http; allow http explicitly")
    return endpoint


def _hf_headers(settings: SourceSettings) -> dict[str, str]:
    return {"Authorization": f"Bearer {settings.hf_token}"} if settings.hf_token else {}


def hf_file_source(uri: str, org: str, repo: str, revision: str, file_path: str,
                   settings: SourceSettings) -> HttpSource:
    """One file of a Hub repository, by its path in the repository."""
    endpoint = _hf_endpoint(uri, settings)
    url = (f"{endpoint}/{quote(org)}/{quote(repo)}/resolve/{quote(revision, safe='')}/"
           f"{quote(file_path)}")
    return HttpSource(url=url, display=f"hf://{org}/{repo}/{file_path}@{revision}",
                      filename=posixpath.basename(file_path), headers=_hf_headers(settings))


# ---------------------------------------------------------------- directories


@dataclass(frozen=True)
class HubRepository:
    """hf://org/repo?revision=r: a whole repository, listed through the Hub API."""

    uri: str
    org: str
    repo: str
    revision: str
    settings: SourceSettings = field(repr=False)

    @property
    def display(self) -> str:
        return f"hf://{self.org}/{self.repo}@{self.revision}"

    @property
    def dirname(self) -> str:
        return self.repo

    def api_source(self, path: str, query: str = "") -> HttpSource:
        """{endpoint}/api/models/{org}/{repo}/{path}[?query], with the token."""
        endpoint = _hf_endpoint(self.uri, self.settings)
        url = f"{endpoint}/api/models/{quote(self.org)}/{quote(self.repo)}/{path}"
        return HttpSource(url=url + (f"?{query}" if query else ""),
                          display=f"hf://{self.org}/{self.repo} (Hub API)",
                          filename="", headers=_hf_headers(self.settings))

    def file_source(self, revision: str, path: str) -> HttpSource:
        return hf_file_source(self.uri, self.org, self.repo, revision, path, self.settings)


@dataclass(frozen=True)
class S3Prefix:
    """s3://bucket/prefix/: every object under the prefix, listed with ListObjectsV2."""

    uri: str
    bucket: str
    prefix: str  # "" (the whole bucket) or ends with "/"
    settings: SourceSettings = field(repr=False)

    @property
    def display(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    @property
    def dirname(self) -> str:
        return posixpath.basename(self.prefix.rstrip("/")) or self.bucket

    def list_source(self, query: str) -> HttpSource:
        """A signed GET of the bucket with `query` (already encoded the way SigV4 wants)."""
        return _s3_source(self.uri, self.bucket, "", self.settings, query=query)

    def object_source(self, key: str) -> HttpSource:
        return _s3_source(self.uri, self.bucket, key, self.settings)


DirectorySource = HubRepository | S3Prefix


def is_directory_uri(uri: str) -> bool:
    """hf://org/repo (no file part) or s3://bucket/prefix/ (ending in '/')."""
    parts = urlsplit(uri.strip())
    scheme = parts.scheme.lower()
    if scheme == "hf":
        return len([s for s in parts.path.split("/") if s]) == 1
    if scheme == "s3":
        return parts.path.endswith("/")
    return False


def parse_directory_source(uri: str, settings: SourceSettings) -> DirectorySource:
    """Resolve a directory URI (see `is_directory_uri`); InvalidSourceURI for anything else."""
    parts = urlsplit(uri.strip())
    scheme = parts.scheme.lower()
    if scheme == "hf":
        segments = [s for s in parts.path.split("/") if s]
        if not parts.netloc or len(segments) != 1:
            raise _bad(uri, "expected hf://org/repo[?revision=...] for a whole repository")
        query = parse_qs(parts.query)
        unknown = set(query) - {"revision"}
        if unknown:
            raise _bad(uri, f"unknown query parameter(s) {sorted(unknown)}; "
                            "only revision is allowed")
        revision = query.get("revision", ["main"])[0] or "main"
        _hf_endpoint(uri, settings)
        return HubRepository(uri=uri.strip(), org=parts.netloc, repo=segments[0],
                             revision=revision, settings=settings)
    if scheme == "s3":
        bucket, prefix = parts.netloc, parts.path.lstrip("/")
        if not bucket:
            raise _bad(uri, "no bucket (expected s3://bucket/prefix/)")
        if prefix and (not prefix.endswith("/") or prefix.startswith("/") or "//" in prefix):
            raise _bad(uri, "a directory is a prefix ending in one '/'")
        if prefix:
            _clean_relative_path(uri, prefix.rstrip("/") + "/x", "the prefix")
        _s3_source(uri, bucket, "", settings)  # refuses a plain-http endpoint early
        return S3Prefix(uri=uri.strip(), bucket=bucket, prefix=prefix, settings=settings)
    raise _bad(uri, "only hf://org/repo and s3://bucket/prefix/ name a directory")
