"""Metadata URIs: which metadata store a process talks to, and under which root.

Three forms are accepted::

    etcd://host:port[,host:port...][/<root prefix>]
    etcds://host:port[,host:port...][/<root prefix>]
    memory://<name>[/<root prefix>]

``etcd://`` lists one or more endpoints of one etcd cluster (the port
defaults to 2379; IPv6 hosts go in brackets, ``[::1]:2379``).  The path is
the root prefix every asyncbk key lives under, so several asyncbk clusters
can share one etcd: ``etcd://127.0.0.1:2379/prod`` keeps everything under
``/prod/``; no path means the etcd root.  ``etcds://`` is the same over TLS
(the server's certificate checked, its host name too).  Credentials never go
in the URI (it is printed and logged): the TLS context, user and password
are given beside it (:func:`open_metadata_store`).

``memory://<name>`` is an in-process store: every URI with the same name in
one process shares one state (the simulator and unit tests run bookies and
clients in one process this way).
"""

from __future__ import annotations

import ssl as ssl_module
from dataclasses import dataclass, field

from ..errors import ConfigError
from . import keys
from .api import MetadataStore

ETCD_PORT_DEFAULT = 2379
EXPECTED_FORMS = ("etcd://host:port[,host:port...]/<root prefix> (etcds:// for TLS) "
                  "or memory://<name>")


@dataclass(frozen=True)
class MetadataUri:
    scheme: str
    """``"etcd"`` or ``"memory"``."""
    endpoints: list[tuple[str, int]] = field(default_factory=list)
    """etcd endpoints as ``(host, port)``; empty for ``memory``."""
    root: str = ""
    """Normalised root prefix (``""`` or ``"/a/b"``, see ``keys.normalize_root``)."""
    name: str = ""
    """Name of the shared in-process state (``memory`` only)."""
    tls: bool = False
    """etcd over TLS (``etcds://``)."""

    def __str__(self) -> str:
        if self.scheme == "memory":
            return f"memory://{self.name}{self.root}"
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.endpoints)
        return f"{'etcds' if self.tls else 'etcd'}://{hosts}{self.root}"


def _invalid(uri: str, why: str) -> ConfigError:
    return ConfigError(f"invalid metadata URI {uri!r}: {why}; expected {EXPECTED_FORMS}")


def _parse_endpoint(uri: str, text: str) -> tuple[str, int]:
    text = text.strip()
    if not text:
        raise _invalid(uri, "empty endpoint")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not host:
            raise _invalid(uri, f"bad IPv6 endpoint {text!r}")
        if rest and not rest.startswith(":"):
            raise _invalid(uri, f"bad endpoint {text!r}")
        port_text = rest[1:] if rest else ""
    else:
        host, sep, port_text = text.partition(":")
        if ":" in port_text:
            raise _invalid(uri, f"IPv6 host in {text!r} must be written [addr]:port")
        if not host:
            raise _invalid(uri, f"endpoint {text!r} has no host")
        if sep and not port_text:
            raise _invalid(uri, f"endpoint {text!r} has an empty port")
    if not port_text:
        return host, ETCD_PORT_DEFAULT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise _invalid(uri, f"port {port_text!r} of {text!r} is not in 1..65535")
    return host, int(port_text)


def parse_metadata_uri(uri: str) -> MetadataUri:
    """Parse a metadata URI; raises ConfigError showing the expected forms."""
    scheme, sep, rest = uri.strip().partition("://")
    scheme = scheme.lower()
    if not sep:
        raise _invalid(uri, "no scheme")
    if any(c in rest for c in "?#@"):
        raise _invalid(uri, "query strings, fragments and user names are not supported")
    authority, slash, path = rest.partition("/")
    root = keys.normalize_root(path) if slash else ""
    if scheme in ("etcd", "etcds"):
        if not authority:
            raise _invalid(uri, "no etcd endpoint")
        endpoints = [_parse_endpoint(uri, part) for part in authority.split(",")]
        return MetadataUri(scheme="etcd", endpoints=endpoints, root=root, tls=scheme == "etcds")
    if scheme == "memory":
        if not authority:
            raise _invalid(uri, "no store name")
        return MetadataUri(scheme="memory", endpoints=[], root=root, name=authority)
    raise _invalid(uri, f"unknown scheme {scheme!r}")


async def open_metadata_store(uri: str, timeout_s: float = 10.0, *,
                              ssl: ssl_module.SSLContext | None = None,
                              user: str | None = None,
                              password: str | None = None) -> MetadataStore:
    """The store ``uri`` names, ready to use (for etcd: connected and checked).

    For ``etcds://``, ``ssl`` is the client TLS context (the CA that signed
    etcd's certificate, and a client certificate where etcd requires one);
    without it, the system's CAs.  ``user`` and ``password``: etcd's own
    authentication (both or neither).  Raises ConfigError for a malformed URI
    or TLS settings beside a plain ``etcd://`` URI, MetadataError if etcd
    cannot be reached or refuses.  The caller owns the store and must
    ``close()`` it.
    """
    parsed = parse_metadata_uri(uri)
    if (user is None) != (password is None):
        raise ConfigError("etcd authentication needs both a user name and a password "
                          "(--etcd-user and --etcd-password-file)")
    if parsed.scheme == "etcd":
        if ssl is not None and not parsed.tls:
            raise ConfigError(f"TLS settings for etcd were given, but the metadata URI {uri!r} "
                              "is plain etcd://; write it etcds://... to use TLS")
        if parsed.tls and ssl is None:
            import asyncio  # reading the system's CAs is file I/O: off the loop

            ssl = await asyncio.to_thread(ssl_module.create_default_context)
        from .etcd import EtcdMetadataStore  # imported lazily: pulls in aiohttp and etcd3

        return await EtcdMetadataStore.connect(parsed.endpoints, parsed.root, timeout_s,
                                               ssl_context=ssl, user=user, password=password)
    if ssl is not None or user is not None:
        raise ConfigError(f"TLS and user settings are for etcd; {uri!r} is an in-process store")
    from .memory import MemoryMetadataStore, named_state

    return MemoryMetadataStore(parsed.root, state=named_state(parsed.name))
