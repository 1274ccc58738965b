"""Network locations of bookies and clients: ``/region/rack`` paths.

A bookie declares where it runs (``asyncbk bookie --rack /eu/r1``, registered in
its registration info under ``"rack"``); a client may also map bookies to
locations itself, which wins: ``ClientConfig.bookie_racks`` (static), then
``bookie_racks_file`` (lines ``<bookie-id or host> <location>``, parsed here by
:func:`parse_rack_file`), then ``bookie_racks_script`` (a program printing one
location per host, its output parsed by :func:`parse_script_output`).  A location
has one or two components: ``/r1`` is rack ``r1`` of the default region, and a
bookie that declares nothing is in ``/default-region/default-rack``.

Everything here is pure: placement policies and the read order take a mapping of
bookie id to location and compute, without I/O (reading the file and running the
script is :class:`asyncbk.client.bookies.RackMapping`'s).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .errors import ConfigError
from .types import BookieId, parse_bookie_id

DEFAULT_REGION = "default-region"
DEFAULT_RACK = "default-rack"
DEFAULT_LOCATION = f"/{DEFAULT_REGION}/{DEFAULT_RACK}"
"""Where a bookie that declares no location is (BookKeeper's default too)."""

POLICIES = ("random", "rack-aware", "region-aware")
"""The values of ``ClientConfig.placement_policy`` (policies in :mod:`.client.placement`)."""
LOCATION_KEY = "rack"
"""The key of a bookie's location in its registration info."""

_COMPONENT = re.compile(r"[A-Za-z0-9._-]+")


def normalize_location(location: str) -> str:
    """``/region/rack`` for a location given as ``""``, ``/rack`` or ``/region/rack``;
    raises ValueError for anything else."""
    if location == "":
        return DEFAULT_LOCATION
    if not isinstance(location, str) or not location.startswith("/"):
        raise ValueError(f"a network location is an absolute path such as /region/rack or "
                         f"/rack, not {location!r}")
    parts = location[1:].split("/")
    if not 1 <= len(parts) <= 2 or not all(_COMPONENT.fullmatch(p) for p in parts):
        raise ValueError(f"a network location is /region/rack or /rack (components of "
                         f"letters, digits, '.', '_' and '-'), not {location!r}")
    if len(parts) == 1:
        return f"/{DEFAULT_REGION}/{parts[0]}"
    return f"/{parts[0]}/{parts[1]}"


def region_of(location: str) -> str:
    """The region of a normalized location (``/eu/r1`` -> ``eu``)."""
    return location.split("/")[1]


def resolve_locations(registered: Mapping[BookieId, str],
                      overrides: Mapping[BookieId, str] | None = None,
                      mapped: Mapping[BookieId, str] | None = None) -> dict[BookieId, str]:
    """Normalized locations: ``overrides`` (a client's static mapping) win over
    ``mapped`` (what its rack file and script say, normalized), which win over what
    bookies registered; a registered value that is not a valid location counts as the
    default location (a bookie cannot break its clients' placement)."""
    out: dict[BookieId, str] = {}
    for bookie, location in registered.items():
        try:
            out[bookie] = normalize_location(location)
        except ValueError:
            out[bookie] = DEFAULT_LOCATION
    for bookie, location in (mapped or {}).items():
        out[bookie] = location
    for bookie, location in (overrides or {}).items():
        out[bookie] = normalize_location(location)
    return out


def location_of(bookie: BookieId, locations: Mapping[BookieId, str]) -> str:
    """``bookie``'s location in ``locations`` (normalized), the default one if absent."""
    return locations.get(bookie, DEFAULT_LOCATION)


def read_order(replicas: Sequence[BookieId], locations: Mapping[BookieId, str],
               client_location: str) -> list[BookieId]:
    """The order to read ``replicas`` in: those in the client's rack first, then those
    in its region, then the others; ties keep the order of ``replicas`` (the write
    set's).  ``client_location`` is normalized, or ``""``: no preference."""
    if not client_location:
        return list(replicas)
    region = region_of(client_location)

    def distance(bookie: BookieId) -> int:
        loc = location_of(bookie, locations)
        if loc == client_location:
            return 0
        return 1 if region_of(loc) == region else 2

    return sorted(replicas, key=distance)  # sorted() is stable


def host_of(bookie: BookieId) -> str:
    """The host part of a bookie id (``10.0.0.5:3181`` -> ``10.0.0.5``; ``[::1]:3181``
    -> ``::1``); the id itself if it is not ``host:port``."""
    try:
        return parse_bookie_id(bookie)[0]
    except ValueError:
        return bookie


@dataclass(frozen=True)
class RackFile:
    """A parsed rack file: locations by bookie id, and by host (any port)."""

    by_id: dict[BookieId, str] = field(default_factory=dict)
    by_host: dict[str, str] = field(default_factory=dict)

    def lookup(self, bookie: BookieId) -> str | None:
        """``bookie``'s location in the file: its id's line, else its host's, else None."""
        found = self.by_id.get(bookie)
        return found if found is not None else self.by_host.get(host_of(bookie))

    def mapped(self, bookies: Iterable[BookieId]) -> dict[BookieId, str]:
        """The locations the file gives: every bookie id listed, and ``bookies``
        that the file maps by id or host."""
        out = dict(self.by_id)
        for bookie in bookies:
            location = self.lookup(bookie)
            if location is not None:
                out[bookie] = location
        return out


RACK_FILE_FORMAT = "<bookie-id or host> <location>, e.g. 10.0.0.5:3181 /eu-west/r12"
RACK_FILE_KEY_FORMAT = ("host:port or [IPv6]:port (port 1-65535), or a host alone: a name, "
                        "an IPv4 address or an IPv6 address, bracketed or not")
"""What the first field of a rack file line may be."""

_PORT = re.compile(r"[0-9]{1,5}")


def _key_error(key: str, problem: str) -> ValueError:
    return ValueError(f"{key} is not a bookie id or a host: {problem}; expected "
                      f"{RACK_FILE_KEY_FORMAT}")


def _port(key: str, port: str) -> int:
    if not _PORT.fullmatch(port) or not 0 < int(port) < 65536:
        raise _key_error(key, f"port {port!r} is not a number from 1 to 65535")
    return int(port)  # 03181 is 3181, as in bookie ids


def _file_key(key: str) -> tuple[bool, str]:
    """``(is a bookie id, key)`` of a rack file line's first field: ``host:port`` is a
    bookie id (its port without leading zeros); a host alone (``[::1]`` written in
    brackets or not) matches any port.  ValueError for a bad port or unbalanced
    brackets: such a key would never match a bookie."""
    if key.startswith("["):
        inner, close, rest = key[1:].partition("]")
        if not close or "[" in inner or "[" in rest or "]" in rest:
            raise _key_error(key, "its brackets are unbalanced")
        if not inner:
            raise _key_error(key, "it has nothing between its brackets")
        if not rest:
            return False, inner
        if not rest.startswith(":"):
            raise _key_error(key, f"{rest!r} follows the closing bracket")
        return True, f"[{inner}]:{_port(key, rest[1:])}"
    if "[" in key or "]" in key:
        raise _key_error(key, "its brackets are unbalanced")
    if key.count(":") != 1:  # a name or an IPv4 address, or a bare IPv6 address: a host
        return False, key
    host, _, port = key.partition(":")
    if not host:
        raise _key_error(key, "it has no host before the ':'")
    return True, f"{host}:{_port(key, port)}"


def parse_rack_file(text: str, source: str) -> RackFile:
    """Parse a rack file: one ``<bookie-id or host> <location>`` per line; ``#`` starts
    a comment, blank lines are skipped.  Raises :class:`~asyncbk.errors.ConfigError`
    naming ``source:line`` for a malformed line, a key that is neither a bookie id nor
    a host (a bad port, unbalanced brackets), a bad location or a key given twice with
    different locations."""
    by_id: dict[BookieId, str] = {}
    by_host: dict[str, str] = {}
    where: dict[tuple[bool, str], int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2:
            raise ConfigError(f"{source}:{number}: expected two fields, {RACK_FILE_FORMAT}; "
                              f"got {len(fields)}")
        key, location = fields
        try:
            normalized = normalize_location(location)
        except ValueError as exc:
            raise ConfigError(f"{source}:{number}: {exc}") from None
        try:
            is_id, name = _file_key(key)
        except ValueError as exc:
            raise ConfigError(f"{source}:{number}: {exc}") from None
        table = by_id if is_id else by_host
        if (is_id, name) in where and table[name] != normalized:
            raise ConfigError(f"{source}:{number}: {key} is given another location on "
                              f"line {where[(is_id, name)]}; keep one of the two lines")
        where.setdefault((is_id, name), number)
        table[name] = normalized
    return RackFile(by_id, by_host)


def parse_script_output(output: str, hosts: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """What a rack script printed for ``hosts``: one location per host, in order,
    separated by whitespace (as BookKeeper's ScriptBasedMapping reads it).  Returns the
    normalized location of each host that got a valid one, and the hosts whose answer
    is not a location; ValueError if the number of answers is not the number of hosts."""
    answers = output.split()
    if len(answers) != len(hosts):
        raise ValueError(f"it printed {len(answers)} location(s) for {len(hosts)} host(s)")
    out: dict[str, str] = {}
    bad: list[str] = []
    for host, answer in zip(hosts, answers, strict=True):
        try:
            out[host] = normalize_location(answer)
        except ValueError:
            bad.append(host)
    return out, bad


__all__ = [
    "DEFAULT_LOCATION", "DEFAULT_RACK", "DEFAULT_REGION", "LOCATION_KEY", "RACK_FILE_FORMAT",
    "RACK_FILE_KEY_FORMAT",
    "RackFile", "host_of", "location_of", "normalize_location", "parse_rack_file",
    "parse_script_output", "read_order", "region_of", "resolve_locations",
]
