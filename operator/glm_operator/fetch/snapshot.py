"""Download a whole model folder (safetensors snapshot) into the cache, verified, then named.

    <dest>/<name>.partial/...   every listed file, each fetched like a single artifact
                                (resume with Range, retries, its own `.partial`, sha256)
    <dest>/<name>/              the same folder, renamed once every file is verified

Each file is checked against the listing: its size always, its sha256 when the Hub gives
one (LFS files: lfs.oid), its git blob sha1 otherwise (Hub files kept in git). S3 gives
neither (an ETag is not a content hash), so there the manifest's sha256s are what was
measured. The whole snapshot has one digest (see `snapshot_digest`), which spec.sha256 pins.

The folder then holds two files of ours:

    .glm-operator.sha256sums     `sha256sum` lines, `<hex>  <path>`, sorted by path bytes;
                                 `sha256sum -c` checks the folder, and its own sha256 is the
                                 snapshot digest
    .glm-operator-manifest.json  source, commit, and path/size/sha256 of every file

A failure leaves nothing under `<name>`: a missing file (404) or a server that gives up keeps
`<name>.partial` for the next attempt to resume; a failed verification removes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import posixpath
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glm_operator.api.modelversion import ModelFacts
from glm_operator.fetch.download import (
    LOCK_SUFFIX,
    PARTIAL_SUFFIX,
    FetchOptions,
    FetchResult,
    exclusive_lock,
    fetch_artifact,
)
from glm_operator.fetch.errors import (
    ChecksumMismatch,
    FetchError,
    InsufficientSpace,
    InvalidModelFile,
    SizeMismatch,
    WrongArchitecture,
)
from glm_operator.fetch.hf_config import (
    architecture_matches,
    architecture_names,
    facts_from_config,
    read_config,
    safetensors_parameter_count,
)
from glm_operator.fetch.listing import DEFAULT_INCLUDE, Listing, RemoteFile, list_directory
from glm_operator.fetch.sources import DirectorySource

log = logging.getLogger("glm_operator.fetch")

SUMS_NAME = ".glm-operator.sha256sums"
MANIFEST_NAME = ".glm-operator-manifest.json"
INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True)
class ManifestEntry:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class SnapshotResult:
    path: Path
    size_bytes: int
    sha256: str  # the snapshot digest
    files: list[ManifestEntry]
    facts: ModelFacts | None
    from_cache: bool
    revision: str | None  # the Hub commit; None for S3
    resumed_files: int  # files continued from a partial download
    seconds: float


def sha256sums_text(entries: Iterable[ManifestEntry]) -> bytes:
    """`<sha256>  <path>\\n` per file, sorted by the path's UTF-8 bytes (LC_ALL=C sort)."""
    ordered = sorted(entries, key=lambda e: e.path.encode())
    return "".join(f"{e.sha256}  {e.path}\n" for e in ordered).encode()


def snapshot_digest(entries: Iterable[ManifestEntry]) -> str:
    """The snapshot's sha256: the sha256 of `sha256sums_text`. From a local copy:

        cd DIR && find . -type f ! -name '.glm-operator*' -printf '%P\\n' | LC_ALL=C sort \\
          | xargs -d '\\n' sha256sum | sha256sum
    """
    return hashlib.sha256(sha256sums_text(entries)).hexdigest()


def _hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(4 * 2**20):
            digest.update(chunk)
    return digest.hexdigest()


def _git_blob_sha1(path: Path) -> str:
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode(), usedforsecurity=False)
    with path.open("rb") as handle:
        while chunk := handle.read(4 * 2**20):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


# ---------------------------------------------------------------- the cached copy


def _read_manifest(folder: Path) -> list[ManifestEntry] | None:
    try:
        data = json.loads((folder / MANIFEST_NAME).read_text())
        return [ManifestEntry(str(f["path"]), int(f["size"]), str(f["sha256"]))
                for f in data["files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _cached_entries(final: Path, display: str, expected: str | None) -> (
        list[ManifestEntry] | None):
    """The cached folder's entries when every file still hashes to its manifest line."""
    entries = _read_manifest(final)
    if entries is None:
        log.warning("%s: %s has no readable manifest; fetching again", display, final)
        return None
    for entry in entries:
        path = final / entry.path
        if not path.is_file() or path.stat().st_size != entry.size or _hash(path) != entry.sha256:
            log.warning("%s: cached %s differs from its manifest; fetching again", display,
                        entry.path)
            return None
    digest = snapshot_digest(entries)
    if expected and digest != expected.lower():
        log.warning("%s: cached snapshot digest %s, expected %s; fetching again", display,
                    digest, expected)
        return None
    return entries


# ---------------------------------------------------------------- downloading


def _remove_strays(partial: Path, listing: Listing) -> None:
    """Drop what an earlier attempt left that this listing does not name."""
    wanted = {f.path for f in listing.files}
    resumable = {p + PARTIAL_SUFFIX for p in wanted}
    for path in sorted(partial.rglob("*"), reverse=True):
        relative = path.relative_to(partial).as_posix()
        if path.is_dir() and not path.is_symlink():
            with contextlib.suppress(OSError):
                path.rmdir()  # only when empty
        elif relative not in wanted and relative not in resumable:
            log.info("removing %s left by an earlier attempt", relative)
            path.unlink()


def _file_present(partial: Path, item: RemoteFile) -> int:
    for candidate in (partial / item.path, partial / (item.path + PARTIAL_SUFFIX)):
        if candidate.is_file():
            return min(candidate.stat().st_size, item.size)
    return 0


def _bytes_present(partial: Path, listing: Listing) -> int:
    return sum(_file_present(partial, item) for item in listing.files)


def _declare_progress(partial: Path, listing: Listing, options: FetchOptions) -> None:
    """The whole folder's size is known from the listing: the status shows the snapshot's
    percentage from the first report, the files already on disk counted as done."""
    if options.meter is None:
        return
    for item in listing.files:
        options.meter.declare(str(partial / (item.path + PARTIAL_SUFFIX)), item.size,
                              _file_present(partial, item))


def _check_space(partial: Path, listing: Listing, options: FetchOptions, display: str) -> None:
    total = sum(f.size for f in listing.files)
    needed = total - _bytes_present(partial, listing)
    free = options.free_bytes(partial)
    if free < needed + options.reserve_bytes:
        raise InsufficientSpace(
            f"{display}: {len(listing.files)} files, {_human(total)} in all, need "
            f"{_human(needed)} more plus a reserve of {_human(options.reserve_bytes)}, but "
            f"the cache volume has {_human(free)} free; grow spec.cache or free space on it")


def _fetch_one(item: RemoteFile, partial: Path, options: FetchOptions) -> FetchResult:
    target = partial / item.path
    if target.is_file() and target.stat().st_size != item.size:
        target.unlink()  # a finished file of another size cannot be this one
    file_options = dataclasses.replace(options, expected_sha256=item.sha256,
                                       expected_architecture=None, parse_gguf=False)
    result = fetch_artifact(item.source, target.parent, target.name, file_options)
    if result.size_bytes != item.size:
        target.unlink(missing_ok=True)
        raise SizeMismatch(f"{item.source.display}: {result.size_bytes} bytes received, the "
                           f"listing says {item.size}; the file was discarded")
    if item.git_blob_sha1 and _git_blob_sha1(target) != item.git_blob_sha1:
        target.unlink(missing_ok=True)
        if result.from_cache:  # left by an earlier attempt: fetch it once more
            return _fetch_one(item, partial, options)
        raise ChecksumMismatch(f"{item.source.display}: git blob id differs from the "
                               f"Hub's {item.git_blob_sha1}; the file was discarded")
    return result


def _check_index(folder: Path, present: set[str], display: str) -> None:
    """Every shard model.safetensors.index.json names must be in the snapshot."""
    for index in [p for p in present if posixpath.basename(p) == INDEX_NAME]:
        try:
            weight_map = json.loads((folder / index).read_text()).get("weight_map") or {}
        except (ValueError, AttributeError) as exc:
            raise InvalidModelFile(f"{display}: {index} is not valid JSON: {exc}") from exc
        base = posixpath.dirname(index)
        missing = sorted({posixpath.join(base, str(s)) for s in weight_map.values()} - present)
        if missing:
            raise InvalidModelFile(
                f"{display}: {index} names shard(s) the source does not have: "
                f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")


def _facts(folder: Path, entries: Sequence[ManifestEntry], options: FetchOptions,
           display: str) -> ModelFacts:
    config = read_config(folder / "config.json")
    if config is None:
        raise InvalidModelFile(f"{display}: no readable config.json at the top of the "
                               "folder; vLLM cannot load it")
    _, names = architecture_names(config)
    wanted = options.expected_architecture
    if wanted and not architecture_matches(wanted, names):
        raise WrongArchitecture(f"{display}: config.json says {', '.join(names) or 'nothing'}, "
                                f"spec.architecture expects {wanted!r}")
    parameters = 0
    for entry in entries:
        if entry.path.endswith(".safetensors"):
            try:
                parameters += safetensors_parameter_count(folder / entry.path)
            except (OSError, ValueError) as exc:
                raise InvalidModelFile(f"{display}: not a readable safetensors file: "
                                       f"{exc}") from exc
    return facts_from_config(config, sum(e.size for e in entries), parameters)


def _write_manifest(folder: Path, entries: list[ManifestEntry], source: DirectorySource,
                    revision: str | None) -> None:
    manifest: dict[str, Any] = {
        "source": source.uri, "revision": revision, "sha256": snapshot_digest(entries),
        "sizeBytes": sum(e.size for e in entries),
        "files": [dataclasses.asdict(e) for e in sorted(entries, key=lambda e: e.path.encode())],
    }
    for name, data in ((SUMS_NAME, sha256sums_text(entries)),
                       (MANIFEST_NAME, (json.dumps(manifest, indent=2) + "\n").encode())):
        with (folder / name).open("wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())


def fetch_snapshot(source: DirectorySource, dest_dir: Path, dirname: str, options: FetchOptions,
                   include: Sequence[str] = DEFAULT_INCLUDE, s3_max_keys: int = 1000) -> (
        SnapshotResult):
    """Make `dest_dir/dirname` a verified copy of the folder; raise a FetchError otherwise."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(dest_dir / (dirname + LOCK_SUFFIX), source.display):
        return _fetch_snapshot_locked(source, dest_dir, dirname, options, include, s3_max_keys)


def _fetch_snapshot_locked(source: DirectorySource, dest_dir: Path, dirname: str,
                           options: FetchOptions, include: Sequence[str], s3_max_keys: int) -> (
        SnapshotResult):
    started = time.monotonic()
    final, partial = dest_dir / dirname, dest_dir / (dirname + PARTIAL_SUFFIX)
    if final.is_dir():
        cached = _cached_entries(final, source.display, options.expected_sha256)
        if cached is not None:
            facts = _facts(final, cached, options, source.display)
            digest = snapshot_digest(cached)
            log.info("%s: already cached and verified at %s (%d files, %s, digest %s)",
                     source.display, final, len(cached), _human(sum(e.size for e in cached)),
                     digest)
            revision = (json.loads((final / MANIFEST_NAME).read_text()) or {}).get("revision")
            return SnapshotResult(final, sum(e.size for e in cached), digest, cached, facts,
                                  True, revision, 0, time.monotonic() - started)
        # Keep the files: each is checked against the new listing before it is reused.
        if partial.exists():
            shutil.rmtree(partial)
        os.replace(final, partial)

    listing = list_directory(source, options, include, s3_max_keys)
    total = sum(f.size for f in listing.files)
    log.info("%s: %d files to fetch, %s%s%s", source.display, len(listing.files), _human(total),
             f" at commit {listing.revision}" if listing.revision else "",
             f"; left out by the include patterns: {', '.join(listing.skipped[:10])}"
             f"{' ...' if len(listing.skipped) > 10 else ''}" if listing.skipped else "")
    partial.mkdir(parents=True, exist_ok=True)
    _remove_strays(partial, listing)
    _check_space(partial, listing, options, source.display)
    _declare_progress(partial, listing, options)

    entries: list[ManifestEntry] = []
    resumed = 0
    # A failed file keeps the other files (and its own .partial if worth resuming) for the
    # next attempt; a failed check of the whole folder discards it, like a bad single file.
    for number, item in enumerate(listing.files, 1):
        log.info("%s: file %d of %d: %s (%s)", source.display, number, len(listing.files),
                 item.path, _human(item.size))
        result = _fetch_one(item, partial, options)
        resumed += 1 if result.resumed_from_bytes else 0
        entries.append(ManifestEntry(item.path, result.size_bytes, result.sha256))
    try:
        _check_index(partial, {e.path for e in entries}, source.display)
        facts = _facts(partial, entries, options, source.display)
        digest = snapshot_digest(entries)
        expected = options.expected_sha256
        if expected and digest != expected.lower():
            raise ChecksumMismatch(
                f"{source.display}: snapshot digest is {digest}, spec.sha256 says "
                f"{expected.lower()} ({len(entries)} files, {total} bytes); the download was "
                "discarded (the digest is defined in docs/fetch.md)")
    except FetchError:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    _write_manifest(partial, entries, source, listing.revision)
    _fsync_dir(partial)
    os.replace(partial, final)
    _fsync_dir(dest_dir)
    elapsed = time.monotonic() - started
    log.info("%s: verified and stored as %s (%d files, %s, digest %s, %.1fs)", source.display,
             final, len(entries), _human(total), digest, elapsed)
    return SnapshotResult(final, total, digest, entries, facts, False, listing.revision,
                          resumed, elapsed)
