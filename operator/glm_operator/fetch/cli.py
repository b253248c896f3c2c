"""`glm-operator fetch`: download, verify and cache one model artifact (the ModelVersion's Job).

    glm-operator fetch --source hf://THUDM/GLM-4-9B-0414-GGUF/glm-4-9b-Q4_K_M.gguf \\
        --dest /cache --sha256 <hex> --architecture glm4 \\
        --modelversion glm4-9b-q4 --namespace models --cache-claim glm4-9b-q4-cache

A folder source (hf://org/repo?revision=r, s3://bucket/prefix/; format safetensors) becomes
the folder /cache/<repo or last prefix segment>/ (fetch/snapshot.py, docs/fetch.md).

Exit status 0 when the verified file is in place, else the failure's own code (2 bad URI,
3 not found, 4 auth, 5 unavailable, 6 disk full, 7 checksum, 8 architecture, 9 not GGUF,
10 size, 11 status report failed). Credentials come from the environment (see sources.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import ssl
import sys
from pathlib import Path

from glm_operator.fetch.download import FetchOptions, FetchResult, fetch_artifact
from glm_operator.fetch.errors import FetchError, InvalidSourceURI
from glm_operator.fetch.listing import DEFAULT_INCLUDE
from glm_operator.fetch.progress import DEFAULT_STATUS_INTERVAL_S, ProgressMeter
from glm_operator.fetch.snapshot import SnapshotResult, fetch_snapshot
from glm_operator.fetch.sources import (
    DirectorySource,
    Source,
    SourceSettings,
    is_directory_uri,
    parse_directory_source,
    parse_source,
)
from glm_operator.kube.client import KubeError

log = logging.getLogger("glm_operator.fetch")
REPORT_FAILED_EXIT = 11
_SIZE = re.compile(r"^(\d+)(Ki|Mi|Gi|Ti|K|M|G|T)?$")
_UNITS = {None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def parse_size(text: str) -> int:
    """A byte count, with Kubernetes quantity suffixes (Ki, Mi, Gi, K, M, G, ...)."""
    match = _SIZE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 512Mi or 2Gi")
    return int(match.group(1)) * _UNITS[match.group(2)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument("--source", default=env("GLM_FETCH_SOURCE"),
                        help="https://, s3://, hf:// or pvc:// URI (env GLM_FETCH_SOURCE)")
    parser.add_argument("--dest", type=Path, default=env("GLM_FETCH_DEST"),
                        help="the cache volume's mount path (env GLM_FETCH_DEST)")
    parser.add_argument("--subdir", default="",
                        help="directory inside --dest for the file (default: its root)")
    parser.add_argument("--filename", help="name in the cache (default: the source's file "
                        "name; for a folder source the repository or last prefix segment)")
    parser.add_argument("--sha256", help="expected SHA-256 (hex) of the file, or the snapshot "
                        "digest of a folder (docs/fetch.md); mismatch fails the fetch")
    parser.add_argument("--architecture",
                        help="expected GGUF general.architecture (glm4, glm4moe, llama, ...)")
    parser.add_argument("--format", choices=["gguf", "safetensors"],
                        help="artifact format (default: gguf when the name ends in .gguf)")
    parser.add_argument("--include", action="append", metavar="GLOB",
                        help="folder sources: file name patterns to fetch, repeatable "
                        f"(default: {' '.join(DEFAULT_INCLUDE)})")
    parser.add_argument("--s3-max-keys", type=int, default=1000,
                        help="folder sources on S3: keys per ListObjectsV2 page (default 1000)")
    parser.add_argument("--allow-http", action="store_true",
                        help="accept plain http:// sources and endpoints")
    parser.add_argument("--hf-endpoint", help="Hub endpoint (default env HF_ENDPOINT, "
                        "else https://huggingface.co)")
    parser.add_argument("--s3-endpoint", help="S3 endpoint URL (default env AWS_ENDPOINT_URL_S3 "
                        "or AWS_ENDPOINT_URL, else AWS)")
    parser.add_argument("--s3-region", help="S3 region (default env AWS_REGION, else us-east-1)")
    parser.add_argument("--pvc-root", type=Path,
                        help="where pvc://CLAIM/... claims are mounted (default /mnt/pvc)")
    parser.add_argument("--ca-bundle", type=Path,
                        help="extra PEM CA bundle to trust for https sources")
    parser.add_argument("--reserve", type=parse_size, default=0,
                        help="free space to leave on the cache volume, e.g. 1Gi (default 0)")
    parser.add_argument("--max-attempts", type=int, default=6,
                        help="attempts without progress before giving up (default 6)")
    parser.add_argument("--retry-delay", type=float, default=1.0,
                        help="first retry delay in seconds, doubled each time (default 1)")
    parser.add_argument("--retry-max-delay", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="socket timeout in seconds (default 60)")
    parser.add_argument("--progress-interval", type=float, default=10.0,
                        help="seconds between progress lines (default 10)")
    parser.add_argument("--result-json", type=Path,
                        help="also write the result as JSON here (e.g. /dev/termination-log)")
    status = parser.add_argument_group("status reporting (the Job's ServiceAccount)")
    status.add_argument("--modelversion", default=env("GLM_FETCH_MODELVERSION"),
                        help="ModelVersion whose status to write (env GLM_FETCH_MODELVERSION)")
    status.add_argument("--namespace", default=env("GLM_FETCH_NAMESPACE"),
                        help="its namespace (default: the pod's own)")
    status.add_argument("--cache-claim", help="cache PVC name, echoed into status.cache")
    status.add_argument("--status-interval", type=float, default=DEFAULT_STATUS_INTERVAL_S,
                        help="least seconds between two progress writes into the status "
                        f"(default {DEFAULT_STATUS_INTERVAL_S:g})")
    status.add_argument("--api-server", help="API server URL (default: in-cluster)")
    status.add_argument("--token-file", help="ServiceAccount token file (default: in-cluster)")
    status.add_argument("--api-ca-file", help="API server CA bundle (default: in-cluster)")


def _ssl_context(ca_bundle: Path | None) -> ssl.SSLContext | None:
    if ca_bundle is None:
        return None
    context = ssl.create_default_context()
    context.load_verify_locations(cafile=str(ca_bundle))
    return context


def _result_json(result: FetchResult, relative_path: str) -> dict[str, object]:
    gguf = result.gguf
    return {
        "path": str(result.path), "cachePath": relative_path, "sizeBytes": result.size_bytes,
        "sha256": result.sha256, "fromCache": result.from_cache,
        "resumedFromBytes": result.resumed_from_bytes, "attempts": result.attempts,
        "seconds": round(result.seconds, 3),
        "gguf": None if gguf is None else {
            "version": gguf.version, "architecture": gguf.architecture,
            "blockCount": gguf.block_count, "contextLength": gguf.context_length,
            "embeddingLength": gguf.embedding_length, "headCount": gguf.head_count,
            "headCountKv": gguf.head_count_kv, "keyLength": gguf.key_length,
            "valueLength": gguf.value_length, "nextnPredictLayers": gguf.nextn_predict_layers,
            "expertCount": gguf.expert_count, "expertUsedCount": gguf.expert_used_count,
            "fileType": gguf.file_type_name, "tensorCount": gguf.tensor_count,
            "tensorDataBytes": gguf.tensor_data_bytes,
        },
    }


def _snapshot_json(result: SnapshotResult, relative_path: str) -> dict[str, object]:
    return {
        "path": str(result.path), "cachePath": relative_path, "sizeBytes": result.size_bytes,
        "sha256": result.sha256, "fromCache": result.from_cache, "revision": result.revision,
        "files": len(result.files), "resumedFiles": result.resumed_files,
        "seconds": round(result.seconds, 3),
        "facts": None if result.facts is None else result.facts.model_dump(
            by_alias=True, exclude_none=True, mode="json"),
    }


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")
    reporter = None
    meter = None
    try:
        if not args.source:
            raise InvalidSourceURI("spec.source.uri: no source given (--source)")
        if args.dest is None:
            raise InvalidSourceURI("no destination given (--dest)")
        settings = SourceSettings.from_environment(
            allow_http=args.allow_http or None, hf_endpoint=args.hf_endpoint,
            s3_endpoint=args.s3_endpoint, s3_region=args.s3_region, pvc_root=args.pvc_root)
        source: Source | DirectorySource
        if is_directory_uri(args.source):
            if args.format == "gguf":
                raise InvalidSourceURI(
                    f"spec.source.uri {args.source!r} names a folder, which only format "
                    "safetensors can be; name the .gguf file instead")
            source = parse_directory_source(args.source, settings)
        else:
            source = parse_source(args.source, settings)
    except FetchError as exc:
        log.error("fetch failed (%s): %s", exc.reason, exc)
        return exc.exit_code

    if args.modelversion:
        from glm_operator.fetch.reporter import StatusReporter, StatusTarget
        from glm_operator.kube.modelversion_status import ServiceAccountAccess
        try:
            access = ServiceAccountAccess.in_cluster(args.api_server, args.token_file,
                                                     args.api_ca_file)
            namespace = args.namespace or access.namespace()
            if not namespace:
                raise KubeError("no namespace: pass --namespace")
            reporter = StatusReporter(access, StatusTarget(namespace, args.modelversion,
                                                           args.cache_claim))
            reporter.fetching(source.display)
            meter = ProgressMeter(reporter.progress, args.status_interval)
        except KubeError as exc:
            log.error("cannot report to ModelVersion %s: %s", args.modelversion, exc)
            return REPORT_FAILED_EXIT

    options = FetchOptions(
        expected_sha256=args.sha256, expected_architecture=args.architecture,
        parse_gguf=False, reserve_bytes=args.reserve, max_attempts=args.max_attempts,
        retry_initial_delay_s=args.retry_delay, retry_max_delay_s=args.retry_max_delay,
        timeout_s=args.timeout, progress_interval_s=args.progress_interval,
        meter=meter, ssl_context=_ssl_context(args.ca_bundle),
    )
    filename = args.filename or (source.dirname if isinstance(source, DirectorySource)
                                 else source.filename)
    relative = str(Path(args.subdir) / filename) if args.subdir else filename
    result: FetchResult | SnapshotResult
    try:
        if isinstance(source, DirectorySource):
            result = fetch_snapshot(source, args.dest / args.subdir, filename, options,
                                    tuple(args.include or DEFAULT_INCLUDE), args.s3_max_keys)
        else:
            parse_gguf = args.format == "gguf" or (args.format is None
                                                   and filename.endswith(".gguf"))
            result = fetch_artifact(source, args.dest / args.subdir, filename,
                                    dataclasses.replace(options, parse_gguf=parse_gguf))
    except FetchError as exc:
        log.error("fetch failed (%s): %s", exc.reason, exc)
        if reporter is not None:
            try:
                reporter.failed(exc)
            except KubeError as report_exc:
                log.error("could not write the failure into the status: %s", report_exc)
        return exc.exit_code
    if args.result_json:
        document = (_snapshot_json(result, relative) if isinstance(result, SnapshotResult)
                    else _result_json(result, relative))
        args.result_json.write_text(json.dumps(document, indent=2) + "\n")
    if reporter is not None:
        try:
            reporter.succeeded(result, relative,
                               meter.final() if meter is not None else None)
        except KubeError as exc:
            log.error("fetched and verified, but could not write the status: %s", exc)
            return REPORT_FAILED_EXIT
    return 0
