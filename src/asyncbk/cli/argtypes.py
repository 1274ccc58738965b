"""argparse value types shared by the commands: each refuses a bad value with a
message argparse prints as ``error: argument --x: ...``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def whole(text: str, least: int) -> int:
    """A whole number >= ``least``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    return whole(text, 1)


def non_negative_int(text: str) -> int:
    return whole(text, 0)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def positive_float(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def client_options(args: argparse.Namespace, names: tuple[str, ...], *,
                   read_rack_file: bool = True) -> dict[str, Any]:
    """The ClientConfig fields ``names`` that ``args`` gives (None: not given), checked
    (ConfigError); with ``read_rack_file``, a ``bookie_racks_file`` among them is read
    and parsed too, so a bad line is refused, naming ``file:line``, before anything is
    contacted.  Blocking: call it before the event loop runs."""
    from ..config import ClientConfig, from_mapping
    from ..errors import ConfigError
    from ..topology import parse_rack_file

    values = {name: getattr(args, name) for name in names
              if getattr(args, name, None) is not None}
    from_mapping(ClientConfig, values, "options")
    path = values.get("bookie_racks_file")
    if read_rack_file and path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"bookie_racks_file {path} does not exist; create it or leave "
                              "out --bookie-racks-file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"bookie_racks_file {path} cannot be read: {exc}") from None
        parse_rack_file(text, path)
    return values
