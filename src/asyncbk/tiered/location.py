"""Where offloaded segments live and how to sign in: :class:`ObjectStoreUri` and
:class:`Credentials`.

An object store is named by a URI, ``s3://BUCKET/PREFIX?endpoint=URL&region=R``
(``endpoint``: any S3-compatible server; without it, AWS itself).  The URI never
carries secrets: segment metadata records it, so every reader knows where a
segment is, and each reader signs in with credentials of its own, from the usual
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (/ ``AWS_SESSION_TOKEN``)
variables or from a credentials file.
"""

from __future__ import annotations

import configparser
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from ..errors import ConfigError

DEFAULT_REGION = "us-east-1"
_QUERY_KEYS = ("endpoint", "region")


@dataclass(frozen=True, slots=True)
class ObjectStoreUri:
    """A bucket and a key prefix in an S3-compatible store (no secrets)."""

    bucket: str
    prefix: str = ""
    """Every object asyncbk writes is under ``prefix/`` ('' for the bucket's root)."""
    endpoint: str | None = None
    """The server's base URL (``http://127.0.0.1:8333``); None: AWS."""
    region: str = DEFAULT_REGION

    @classmethod
    def parse(cls, uri: str) -> ObjectStoreUri:
        """``s3://BUCKET[/PREFIX][?endpoint=URL][&region=R]``; ConfigError saying what is
        wrong otherwise."""
        if not isinstance(uri, str) or not uri.strip():
            raise ConfigError("an object store URI is s3://BUCKET/PREFIX?endpoint=URL")
        parts = urlsplit(uri.strip())
        if parts.scheme.lower() != "s3":
            raise ConfigError(f"object store URI {uri!r}: the scheme must be s3:// "
                              "(s3://BUCKET/PREFIX?endpoint=URL for an S3-compatible server)")
        if parts.username or parts.password:
            raise ConfigError("object store URI: do not put credentials in the URI; use "
                              "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or a credentials file")
        bucket = parts.netloc
        if not bucket or not valid_bucket(bucket):
            raise ConfigError(f"object store URI {uri!r}: bad bucket name {bucket!r} (3 to 63 "
                              "lower-case letters, digits, '.' and '-')")
        query: dict[str, str] = {}
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key not in _QUERY_KEYS:
                raise ConfigError(f"object store URI {uri!r}: unknown parameter {key!r}; known: "
                                  f"{', '.join(_QUERY_KEYS)}")
            query[key] = value
        endpoint = query.get("endpoint") or None
        if endpoint is not None:
            ep = urlsplit(endpoint)
            if ep.scheme not in ("http", "https") or not ep.netloc:
                raise ConfigError(f"object store URI {uri!r}: endpoint must be an http:// or "
                                  f"https:// URL, got {endpoint!r}")
            endpoint = endpoint.rstrip("/")
        prefix = parts.path.strip("/")
        if any(p in ("", ".", "..") for p in prefix.split("/")) and prefix:
            raise ConfigError(f"object store URI {uri!r}: bad prefix {prefix!r}")
        return cls(bucket, prefix, endpoint, query.get("region") or DEFAULT_REGION)

    def __str__(self) -> str:
        query = {k: v for k, v in (("endpoint", self.endpoint), ("region", self.region))
                 if v is not None and not (k == "region" and v == DEFAULT_REGION)}
        tail = f"?{urlencode(query, safe=':/')}" if query else ""
        path = f"/{quote(self.prefix, safe='/')}" if self.prefix else ""
        return f"s3://{self.bucket}{path}{tail}"

    def key(self, name: str) -> str:
        """The full key of ``name`` (relative to the prefix)."""
        return f"{self.prefix}/{name}" if self.prefix else name


def object_name(store: str, key: str) -> str:
    """The full name of object ``key`` of the store at URI ``store``:
    ``s3://bucket/prefix/key[?endpoint=...]`` (for messages and listings)."""
    base, sep, query = store.partition("?")
    return f"{base.rstrip('/')}/{key}{sep}{query}"


def valid_bucket(name: str) -> bool:
    """S3's bucket naming: 3 to 63 lower-case letters, digits, '.' and '-', starting and
    ending with a letter or digit."""
    return (3 <= len(name) <= 63 and name[0].isalnum() and name[-1].isalnum()
            and all(c.islower() or c.isdigit() or c in ".-" for c in name))


@dataclass(frozen=True, slots=True)
class Credentials:
    """An access key and its secret (and a session token, for temporary ones).  The
    secret never appears in ``repr``, logs or errors."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)

    @classmethod
    def new(cls) -> Credentials:
        """Fresh random credentials, in the shapes of AWS's own (a 20-character key id, a
        40-character secret): what a local store is made to require."""
        return cls("AKBK" + secrets.token_hex(8).upper(), secrets.token_urlsafe(30))

    def env_text(self, region: str, comment: str) -> str:
        """The credentials as ``export AWS_...=`` lines (what :meth:`from_file` reads
        back), after ``# comment``."""
        return (f"# {comment}\n"
                f"export AWS_ACCESS_KEY_ID={self.access_key_id}\n"
                f"export AWS_SECRET_ACCESS_KEY={self.secret_access_key}\n"
                f"export AWS_REGION={region}\n")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Credentials | None:
        """The ``AWS_*`` variables (None when the key id or the secret is missing)."""
        env = os.environ if env is None else env
        key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
        if not key or not secret:
            return None
        return cls(key, secret, env.get("AWS_SESSION_TOKEN") or None)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Credentials:
        """Read a credentials file: AWS's INI form (``[default]`` with
        ``aws_access_key_id`` and ``aws_secret_access_key``) or shell lines
        (``[export ]AWS_ACCESS_KEY_ID=...``).  A file others may read is refused.
        (Blocking: call it before the event loop runs, or in a thread.)"""
        p = Path(path)
        try:
            mode = p.stat().st_mode
            text = p.read_text()
        except OSError as exc:
            raise ConfigError(f"credentials file {str(p)!r}: {exc.strerror or exc}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(f"credentials file {str(p)!r} may be read by others: "
                              f"chmod 600 {p}")
        values: dict[str, str] = {}
        if any(line.strip().startswith("[") for line in text.splitlines()):
            ini = configparser.ConfigParser()
            try:
                ini.read_string(text)
            except configparser.Error:
                raise ConfigError(f"credentials file {str(p)!r} is not a valid INI file") from None
            section = ini["default"] if ini.has_section("default") else (
                ini[ini.sections()[0]] if ini.sections() else None)
            if section is not None:
                values = {k.upper(): v.strip() for k, v in section.items()}
        else:
            for line in text.splitlines():
                line = line.strip()
                if not line or line.startswith("#") or "=" not in line:
                    continue
                name, _, value = line.removeprefix("export ").partition("=")
                values[name.strip().upper()] = value.strip().strip("'\"")
        creds = cls.from_env(values)
        if creds is None:
            raise ConfigError(f"credentials file {str(p)!r} has no aws_access_key_id and "
                              "aws_secret_access_key (or AWS_ACCESS_KEY_ID=... and "
                              "AWS_SECRET_ACCESS_KEY=... lines)")
        return creds
