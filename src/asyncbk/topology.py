"""Network locations of bookies and clients: ``/region/rack`` paths.

A bookie declares where it runs (``asyncbk bookie --rack /eu/r1``, registered in
its registration info under ``"rack"``); a client may also map bookie ids to
locations itself (``ClientConfig.bookie_racks``, which wins).  A location has one
or two components: ``/r1`` is rack ``r1`` of the default region, and a bookie
that declares nothing is in ``/default-region/default-rack``.

Everything here is pure: placement policies and the read order take a mapping of
bookie id to location and compute, without I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from .types import BookieId

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
                      overrides: Mapping[BookieId, str] | None = None) -> dict[BookieId, str]:
    """Normalized locations: ``overrides`` (a client's static mapping) win over what
    bookies registered; a registered value that is not a valid location counts as the
    default location (a bookie cannot break its clients' placement)."""
    out: dict[BookieId, str] = {}
    for bookie, location in registered.items():
        try:
            out[bookie] = normalize_location(location)
        except ValueError:
            out[bookie] = DEFAULT_LOCATION
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


__all__ = [
    "DEFAULT_LOCATION", "DEFAULT_RACK", "DEFAULT_REGION", "LOCATION_KEY", "location_of",
    "normalize_location", "read_order", "region_of", "resolve_locations",
]
