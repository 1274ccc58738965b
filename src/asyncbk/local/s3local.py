"""What the local object store's harness does by hand: files only its owner reads
(the credentials, mode 0600), and AWS Signature Version 4 headers for the few
body-less S3 requests it makes itself (creating the bucket, the readiness probe).
The offloader and readers sign through obstore; this is for the harness only."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import os
import re
from pathlib import Path
from urllib.parse import quote, urlsplit

from ..tiered.location import Credentials


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``, readable by its owner only (0600), atomically."""
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def sigv4_headers(method: str, url: str, creds: Credentials, region: str,
                   now: datetime.datetime | None = None) -> dict[str, str]:
    """AWS Signature Version 4 headers for an S3 request without a body (path-style
    URL without a query)."""
    parts = urlsplit(url)
    now = now or datetime.datetime.now(datetime.UTC)
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    day = stamp[:8]
    payload = hashlib.sha256(b"").hexdigest()
    signed = {"host": parts.netloc, "x-amz-content-sha256": payload, "x-amz-date": stamp}
    names = ";".join(sorted(signed))
    canonical = "\n".join([method, quote(parts.path or "/", safe="/-_.~"), parts.query,
                           *(f"{k}:{signed[k]}" for k in sorted(signed)), "", names, payload])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = f"AWS4{creds.secret_access_key}".encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return {"x-amz-content-sha256": payload, "x-amz-date": stamp,
            "authorization": f"AWS4-HMAC-SHA256 Credential={creds.access_key_id}/{scope}, "
                             f"SignedHeaders={names}, Signature={signature}"}


def s3_error_code(body: str) -> str:
    """The ``<Code>`` of an S3 error document ('' if none)."""
    match = re.search(r"<Code>([^<]*)</Code>", body)
    return match.group(1) if match else ""
