"""The local object store's credentials and the few signed S3 requests its harness
makes itself (creating the bucket, the readiness probe): the credentials file it
keeps (mode 0600) and AWS Signature Version 4 headers for body-less requests.
The offloader and readers sign through obstore; this is for the harness only."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit


@dataclass(frozen=True, slots=True)
class LocalS3Credentials:
    access_key_id: str
    secret_access_key: str = field(repr=False)

    @classmethod
    def new(cls) -> LocalS3Credentials:
        # the shapes of AWS's own: 20 upper-case characters, 40 for the secret
        return cls("AKBK" + secrets.token_hex(8).upper(), secrets.token_urlsafe(30))


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``, readable by its owner only (0600), atomically."""
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def credentials_text(creds: LocalS3Credentials, region: str, workdir: Path) -> str:
    return (f"# The credentials of asyncbk's local object store (SeaweedFS) in {workdir}:\n"
            f"# `source` this file to use them.\n"
            f"export AWS_ACCESS_KEY_ID={creds.access_key_id}\n"
            f"export AWS_SECRET_ACCESS_KEY={creds.secret_access_key}\n"
            f"export AWS_REGION={region}\n")


def read_credentials(path: Path) -> LocalS3Credentials | None:
    """The credentials a previous start wrote (None if there are none)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    values: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.strip().removeprefix("export ").partition("=")
        if sep and not name.startswith("#"):
            values[name.strip()] = value.strip()
    key, secret = values.get("AWS_ACCESS_KEY_ID"), values.get("AWS_SECRET_ACCESS_KEY")
    return LocalS3Credentials(key, secret) if key and secret else None


def sigv4_headers(method: str, url: str, creds: LocalS3Credentials, region: str,
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
