"""SigV4 against botocore's own signer (same inputs, same signature) and AWS's doc example."""

from __future__ import annotations

import datetime as dt

import pytest
from glm_operator.fetch.s3_signing import (
    EMPTY_PAYLOAD_SHA256,
    S3Credentials,
    object_path,
    sign_request,
)

MOMENT = dt.datetime(2013, 5, 24, 0, 0, 0, tzinfo=dt.UTC)
AWS_EXAMPLE = S3Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")


def test_aws_documentation_get_object_example() -> None:
    # "Example: GET Object" in the S3 SigV4 "single chunk" documentation.
    headers = sign_request("GET", "https://examplebucket.s3.amazonaws.com/test.txt",
                           {"Range": "bytes=0-9"}, AWS_EXAMPLE, "us-east-1", MOMENT)
    assert headers["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )


@pytest.mark.parametrize("key", ["glm/model.Q4_K_M.gguf", "dir with space/m+1.gguf", "ünï/x.gguf"])
@pytest.mark.parametrize("token", [None, "session-token"])
def test_same_signature_as_botocore(key: str, token: str | None) -> None:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    url = "http://127.0.0.1:9000" + object_path("models", key)
    request = AWSRequest(method="GET", url=url, headers={"Range": "bytes=100-"})
    request.headers["X-Amz-Content-SHA256"] = EMPTY_PAYLOAD_SHA256
    S3SigV4Auth(Credentials("AK", "SECRET", token), "s3", "us-east-1").add_auth(request)
    # botocore signs with its own clock: sign ours at the moment it used.
    moment = dt.datetime.strptime(request.headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(
        tzinfo=dt.UTC)
    ours = sign_request("GET", url, {"Range": "bytes=100-"},
                        S3Credentials("AK", "SECRET", token), "us-east-1", moment)
    assert ours["Authorization"] == request.headers["Authorization"]
