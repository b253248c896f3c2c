"""AWS Signature Version 4 for plain S3 GET/HEAD requests.

A GET of one object is all the fetcher asks of S3, so it signs the request itself instead of
carrying boto3 (and its 80 MB of botocore) in the runtime image. Tested against botocore's
signer in the unit tests and against a real MinIO server in e2e/.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

ALGORITHM = "AWS4-HMAC-SHA256"
# The body of a GET is empty; S3 wants its hash (or UNSIGNED-PAYLOAD) in x-amz-content-sha256.
EMPTY_PAYLOAD_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True)
class S3Credentials:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def __repr__(self) -> str:  # never print the secret into a log
        return f"S3Credentials(access_key_id={self.access_key_id!r}, secret_access_key=***)"


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode("utf-8"), hashlib.sha256).digest()


def object_path(bucket: str, key: str) -> str:
    """The path-style request path for an object, encoded the way SigV4 canonicalises it."""
    return "/" + quote(bucket, safe="") + "/" + quote(key, safe="/-_.~")


def sign_request(
    method: str,
    url: str,
    headers: Mapping[str, str],
    credentials: S3Credentials,
    region: str,
    now: dt.datetime | None = None,
    payload_sha256: str = EMPTY_PAYLOAD_SHA256,
) -> dict[str, str]:
    """Return `headers` plus x-amz-date, x-amz-content-sha256 and Authorization.

    Every header passed in is signed (Range included), as is Host, taken from the URL.
    The URL's path must already be percent-encoded (see `object_path`).
    """
    moment = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    amz_date = moment.strftime("%Y%m%dT%H%M%SZ")
    date_stamp = moment.strftime("%Y%m%d")
    parts = urlsplit(url)
    signed: dict[str, str] = {k: v for k, v in headers.items()}
    signed["x-amz-date"] = amz_date
    signed["x-amz-content-sha256"] = payload_sha256
    if credentials.session_token:
        signed["x-amz-security-token"] = credentials.session_token
    canonical = {k.lower(): " ".join(v.strip().split()) for k, v in signed.items()}
    canonical["host"] = parts.netloc
    names = sorted(canonical)
    query = "&".join(
        sorted(
            f"{quote(unquote(k), safe='-_.~')}={quote(unquote(v), safe='-_.~')}"
            for k, _, v in (pair.partition("=") for pair in parts.query.split("&") if pair)
        )
    )
    canonical_request = "\n".join(
        [
            method,
            parts.path or "/",
            query,
            "".join(f"{name}:{canonical[name]}\n" for name in names),
            ";".join(names),
            payload_sha256,
        ]
    )
    scope = f"{date_stamp}/{region}/s3/aws4_request"
    string_to_sign = "\n".join(
        [ALGORITHM, amz_date, scope, hashlib.sha256(canonical_request.encode()).hexdigest()]
    )
    key = _hmac(("AWS4" + credentials.secret_access_key).encode(), date_stamp)
    for part in (region, "s3", "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
    signed["Authorization"] = (
        f"{ALGORITHM} Credential={credentials.access_key_id}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return signed
