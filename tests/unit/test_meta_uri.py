"""Metadata URI parsing."""

from __future__ import annotations

import pytest

from asyncbk.errors import ConfigError
from asyncbk.meta.uri import MetadataUri, parse_metadata_uri


@pytest.mark.parametrize(
    ("uri", "endpoints", "root"),
    [
        ("etcd://127.0.0.1:2379/asyncbk", [("127.0.0.1", 2379)], "/asyncbk"),
        ("etcd://127.0.0.1:2379", [("127.0.0.1", 2379)], ""),
        ("etcd://127.0.0.1:2379/", [("127.0.0.1", 2379)], ""),
        ("etcd://h1:1,h2:2,h3:3/a/b/", [("h1", 1), ("h2", 2), ("h3", 3)], "/a/b"),
        ("etcd://etcd.example.com/x", [("etcd.example.com", 2379)], "/x"),
        ("ETCD://[::1]:2380/x", [("::1", 2380)], "/x"),
        ("etcd://[::1],h:5//x//", [("::1", 2379), ("h", 5)], "/x"),
    ],
)
def test_etcd_uris(uri: str, endpoints: list[tuple[str, int]], root: str) -> None:
    assert parse_metadata_uri(uri) == MetadataUri("etcd", endpoints, root)


def test_memory_uris() -> None:
    assert parse_metadata_uri("memory://sim") == MetadataUri("memory", [], "", name="sim")
    assert parse_metadata_uri("memory://sim/r/") == MetadataUri("memory", [], "/r", name="sim")


def test_round_trip() -> None:
    for uri in ("etcd://h1:1,[::1]:2/a/b", "etcd://h:2379", "memory://x/y"):
        assert str(parse_metadata_uri(uri)) == uri


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "127.0.0.1:2379",
        "zk://h:2181/ledgers",
        "etcd://",
        "etcd:///root",
        "etcd://h:0/x",
        "etcd://h:70000/x",
        "etcd://h:port/x",
        "etcd://h:/x",
        "etcd://h1:1,,h2:2/x",
        "etcd://::1:2379/x",
        "etcd://[::1/x",
        "etcd://user@h:1/x",
        "etcd://h:1/x?timeout=3",
        "memory://",
    ],
)
def test_bad_uris_show_the_expected_form(uri: str) -> None:
    with pytest.raises(ConfigError, match=r"expected etcd://host:port\[,host:port\.\.\.\]/"):
        parse_metadata_uri(uri)
