"""The client settings the simulator tests share: short timeouts on virtual time."""

from __future__ import annotations

from asyncbk.config import ClientConfig

PW = b"pw"
"""The ledger password the simulator tests write with."""


def config(**kw: object) -> ClientConfig:
    """A validated :class:`ClientConfig` with the simulator tests' short timeouts and
    no explicit-LAC timer, updated by ``kw``."""
    base: dict[str, object] = dict(add_timeout_s=0.5, read_timeout_s=0.5, connect_timeout_s=0.3,
                                   reconnect_backoff_s_max=0.2, explicit_lac_interval_s=0.0)
    base.update(kw)
    return ClientConfig(**base).validate()  # type: ignore[arg-type]
