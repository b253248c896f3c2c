"""List the files of a directory source: a Hub repository at one commit, or an S3 prefix.

    Hub  GET {endpoint}/api/models/{org}/{repo}/revision/{rev}   -> {"sha": commit, ...}
         GET {endpoint}/api/models/{org}/{repo}/tree/{commit}?recursive=true
             -> [{"type": "file", "path", "size", "oid" (git blob sha1),
                  "lfs": {"oid" (sha256), "size", "pointerSize"}}, {"type": "directory"}, ...]
             further pages follow the Link header's rel="next" URL (huggingface_hub `paginate`)
    S3   GET /{bucket}/?list-type=2&prefix=P&max-keys=N[&continuation-token=T]  (SigV4)
             -> ListBucketResult: Contents{Key, Size, ETag}, IsTruncated, NextContinuationToken

The revision is resolved to its commit first, and every file is then read at that commit, so
a branch that moves during a long download cannot mix two commits into one snapshot.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import posixpath
import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote, urljoin

from glm_operator.fetch.download import FetchOptions, read_document
from glm_operator.fetch.errors import InvalidModelFile, SourceNotFound, SourceUnavailable
from glm_operator.fetch.sources import DirectorySource, HttpSource, HubRepository, S3Prefix

log = logging.getLogger("glm_operator.fetch")

# What vLLM (and transformers) read from a model folder. Everything else in a repository
# (pickled *.bin/*.pt duplicates of the weights, *.gguf, original/ checkpoints, images,
# README.md, .gitattributes) is left out: it can double the download and is never loaded.
DEFAULT_INCLUDE: tuple[str, ...] = (
    "*.safetensors",  # the weights (model-00001-of-000NN.safetensors, ...)
    "*.json",  # config.json, generation_config.json, model.safetensors.index.json, tokenizer*
    "*.jinja",  # chat_template.jinja
    "*.model",  # sentencepiece tokenizer.model
    "*.tiktoken",  # tiktoken vocabularies
    "*.txt",  # merges.txt, vocab.txt
    "*.py",  # configuration_*.py / modeling_*.py of trust_remote_code models (ChatGLM)
)
# Names the fetcher writes into the snapshot itself; a source file by that name is refused.
RESERVED_PREFIX = ".glm-operator"
_S3_NAMESPACE = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_NEXT_LINK = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')
_MAX_PAGES = 10_000


@dataclass(frozen=True)
class RemoteFile:
    path: str  # relative to the snapshot directory, '/'-separated
    size: int
    source: HttpSource
    sha256: str | None = None  # Hub LFS files: lfs.oid
    git_blob_sha1: str | None = None  # Hub files kept in git (not LFS): the blob oid


@dataclass(frozen=True)
class Listing:
    files: list[RemoteFile]  # sorted by path, filtered by the include patterns
    skipped: list[str]  # paths the include patterns left out
    revision: str | None  # the Hub commit the files are read at; None for S3


def _included(path: str, include: Sequence[str]) -> bool:
    name = posixpath.basename(path)
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(path, p) for p in include)


def _check_path(display: str, path: str) -> str:
    normal = posixpath.normpath(path)
    if (not path or path != normal or normal.startswith(("/", "../")) or normal == ".."
            or "\n" in path or "\\" in path):
        raise InvalidModelFile(f"{display}: refusing the file name {path!r} "
                               "(absolute, '..', backslash or newline)")
    return normal


def _select(display: str, found: list[RemoteFile], include: Sequence[str]) -> (
        tuple[list[RemoteFile], list[str]]):
    kept, skipped = [], []
    for item in sorted(found, key=lambda f: f.path.encode()):
        _check_path(display, item.path)
        if item.path.split("/")[0].startswith(RESERVED_PREFIX):
            skipped.append(item.path)
        elif _included(item.path, include):
            kept.append(item)
        else:
            skipped.append(item.path)
    if not kept:
        raise SourceNotFound(
            f"{display}: no files matching {', '.join(include)} "
            f"({len(skipped)} other file(s) found)")
    if not any(f.path.endswith(".safetensors") for f in kept):
        raise InvalidModelFile(
            f"{display}: no *.safetensors file among {len(kept)} file(s); format safetensors "
            "needs the weights as safetensors")
    return kept, skipped


def _json(body: bytes, display: str) -> object:
    try:
        return json.loads(body)
    except ValueError as exc:
        raise SourceUnavailable(f"{display}: the Hub API answered something not JSON: "
                                f"{body[:200]!r}") from exc


def _not_found_hint(exc: SourceNotFound, display: str, what: str) -> SourceNotFound:
    return SourceNotFound(f"{display}: {what} not found (HTTP 404); check the URI and that "
                          f"the credentials may read it ({exc})")


def list_hub(repo: HubRepository, options: FetchOptions, include: Sequence[str]) -> Listing:
    try:
        body, _ = read_document(
            repo.api_source(f"revision/{quote(repo.revision, safe='')}"), options)
    except SourceNotFound as exc:
        raise _not_found_hint(exc, repo.display, "repository or revision") from exc
    info = _json(body, repo.display)
    commit = info.get("sha") if isinstance(info, dict) else None
    if not isinstance(commit, str) or not commit:
        raise SourceUnavailable(f"{repo.display}: the Hub API gave no commit sha for the "
                                "revision")
    if commit != repo.revision:
        log.info("%s: revision %s is commit %s", repo.display, repo.revision, commit)
    source = repo.api_source(f"tree/{quote(commit, safe='')}", "recursive=true")
    found: list[RemoteFile] = []
    for _ in range(_MAX_PAGES):
        try:
            body, headers = read_document(source, options)
        except SourceNotFound as exc:
            raise _not_found_hint(exc, repo.display, f"tree of commit {commit}") from exc
        entries = _json(body, repo.display)
        if not isinstance(entries, list):
            raise SourceUnavailable(f"{repo.display}: the tree listing is not a JSON list")
        for entry in entries:
            if not isinstance(entry, dict) or entry.get("type") != "file":
                continue
            path, size = entry.get("path"), entry.get("size")
            if not isinstance(path, str) or not isinstance(size, int):
                raise SourceUnavailable(f"{repo.display}: tree entry without path/size: "
                                        f"{entry!r}")
            lfs = entry.get("lfs")
            sha256 = lfs.get("oid") if isinstance(lfs, dict) else None
            blob = entry.get("oid") if lfs is None else None
            found.append(RemoteFile(
                path=path, size=size, source=repo.file_source(commit, path),
                sha256=sha256.lower() if isinstance(sha256, str) else None,
                git_blob_sha1=blob.lower() if isinstance(blob, str) else None))
        match = _NEXT_LINK.search(headers.get("Link") or "")
        if not match:
            break
        source = HttpSource(url=urljoin(source.url, match.group(1)), display=source.display,
                            filename="", headers=source.headers)
    else:
        raise SourceUnavailable(f"{repo.display}: more than {_MAX_PAGES} listing pages")
    files, skipped = _select(repo.display, found, include)
    return Listing(files, skipped, commit)


def _s3_query(prefix: str, max_keys: int, token: str | None) -> str:
    params = {"list-type": "2", "max-keys": str(max_keys), "prefix": prefix}
    if token is not None:
        params["continuation-token"] = token
    # Sorted and encoded exactly as SigV4 canonicalises a query (s3_signing.sign_request).
    return "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
                    for k, v in sorted(params.items()))


def _xml_text(element: ElementTree.Element, name: str) -> str | None:
    child = element.find(_S3_NAMESPACE + name)
    if child is None:
        child = element.find(name)
    return child.text if child is not None else None


def list_s3(prefix: S3Prefix, options: FetchOptions, include: Sequence[str],
            max_keys: int = 1000) -> Listing:
    found: list[RemoteFile] = []
    token: str | None = None
    for _ in range(_MAX_PAGES):
        source = prefix.list_source(_s3_query(prefix.prefix, max_keys, token))
        try:
            body, _ = read_document(source, options)
        except SourceNotFound as exc:
            raise _not_found_hint(exc, prefix.display, f"bucket {prefix.bucket}") from exc
        try:
            root = ElementTree.fromstring(body)
        except ElementTree.ParseError as exc:
            raise SourceUnavailable(f"{prefix.display}: ListObjectsV2 answer is not XML: "
                                    f"{body[:200]!r}") from exc
        for contents in [*root.findall(_S3_NAMESPACE + "Contents"), *root.findall("Contents")]:
            key, size = _xml_text(contents, "Key"), _xml_text(contents, "Size")
            if key is None or size is None:
                raise SourceUnavailable(f"{prefix.display}: listed object without Key/Size")
            if key.endswith("/"):  # a "folder" marker object, not a file
                continue
            found.append(RemoteFile(path=key[len(prefix.prefix):], size=int(size),
                                    source=prefix.object_source(key)))
        truncated = (_xml_text(root, "IsTruncated") or "false").lower() == "true"
        token = _xml_text(root, "NextContinuationToken")
        if not truncated:
            break
        if not token:
            raise SourceUnavailable(f"{prefix.display}: truncated listing without a "
                                    "NextContinuationToken")
    else:
        raise SourceUnavailable(f"{prefix.display}: more than {_MAX_PAGES} listing pages")
    if not found:
        raise SourceNotFound(f"{prefix.display}: no objects under this prefix")
    files, skipped = _select(prefix.display, found, include)
    return Listing(files, skipped, None)


def list_directory(source: DirectorySource, options: FetchOptions, include: Sequence[str],
                   s3_max_keys: int = 1000) -> Listing:
    if isinstance(source, HubRepository):
        return list_hub(source, options, include)
    return list_s3(source, options, include, s3_max_keys)
