"""The client: ``asyncbk.BookKeeper``."""

from __future__ import annotations

import hmac
import json
import random
import ssl as ssl_module
import time
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from ..build import log_build_once
from ..config import ClientConfig, from_mapping
from ..errors import BKError, NotEnoughBookiesError, UnauthorizedAccessError
from ..log import get_logger
from ..meta.api import MetadataStore
from ..meta.model import DIGESTS, LedgerMetadata, LedgerState, new_metadata
from ..meta.uri import open_metadata_store
from ..net.connector import Connector, tcp_connector
from ..net.pool import BookieClient
from ..tiered.store import ObjectStores
from ..topology import POLICIES
from ..tracing import Tracing
from ..types import BookieId
from .bookies import WRITABLE_STATE, BookieWatcher, RackMapping
from .context import ClientContext, ClientStats
from .ledger import LedgerHandle, ReadHandle
from .placement import PlacementPolicy, Quarantine, make_policy
from .recovery import LedgerRecoveryOp

__all__ = ["PLACEMENT_KEY", "WRITABLE_STATE", "BookKeeper", "BookieWatcher", "ClientContext",
           "ClientStats", "PlacementSpec", "ledger_placement", "placement_record"]

PLACEMENT_KEY = "asyncbk.placement"
"""The custom metadata key under which ``create_ledger(placement=...)`` records the
ledger's own placement (:func:`placement_record`), so that whoever replaces its
bookies later (auto-recovery, ``asyncbk shell recover``, the placement check) uses
it.  Reserved: ``create_ledger`` refuses it in ``metadata``."""


@dataclass(frozen=True, slots=True)
class PlacementSpec:
    """A placement policy for some ledgers (``create_ledger(placement=...)``; a
    namespace's segments), instead of the client's own.  The fields are the client
    settings of the same name (see docs/placement.md); each one left None is the
    client's setting.  Bad values raise ValueError (TypeError for a wrong type)."""

    placement_policy: str | None = None
    """``"random"``, ``"rack-aware"`` or ``"region-aware"``."""
    min_racks_per_write_quorum: int | None = None
    min_regions_per_write_quorum: int | None = None
    enforce_placement: bool | None = None

    def __post_init__(self) -> None:
        policy = self.placement_policy
        if policy is not None and (not isinstance(policy, str) or policy not in POLICIES):
            raise ValueError(f"placement_policy must be one of {', '.join(POLICIES)} (or "
                             f"None: the client's), not {policy!r}")
        for name in ("min_racks_per_write_quorum", "min_regions_per_write_quorum"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int (or None: the client's), not "
                                f"{type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, not {value}")
        if self.enforce_placement is not None and not isinstance(self.enforce_placement, bool):
            raise TypeError(f"enforce_placement must be a bool (or None: the client's), not "
                            f"{type(self.enforce_placement).__name__}")

    def resolve(self, config: ClientConfig) -> tuple[str, int, int, bool]:
        """``(policy, min racks, min regions, enforce)``: this, the client's settings
        where it says nothing; the settings a policy ignores are normalized away (so
        that equal policies have equal keys)."""
        policy = self.placement_policy if self.placement_policy is not None \
            else config.placement_policy
        racks = self.min_racks_per_write_quorum if self.min_racks_per_write_quorum is not None \
            else config.min_racks_per_write_quorum
        regions = self.min_regions_per_write_quorum \
            if self.min_regions_per_write_quorum is not None \
            else config.min_regions_per_write_quorum
        enforce = self.enforce_placement if self.enforce_placement is not None \
            else config.enforce_placement
        if policy == "random":
            return policy, 0, 0, False
        if policy == "rack-aware":
            regions = 0
        return policy, racks, regions, enforce


_RECORD_FIELDS = {"policy": "placement_policy",
                  "min_racks_per_write_quorum": "min_racks_per_write_quorum",
                  "min_regions_per_write_quorum": "min_regions_per_write_quorum",
                  "enforce": "enforce_placement"}
"""Key in the record -> PlacementSpec field."""


def placement_record(spec: PlacementSpec, config: ClientConfig) -> bytes:
    """The value of :data:`PLACEMENT_KEY` for a ledger created with ``spec`` by a
    client with ``config``: compact JSON of the resolved spec (``spec``, the client's
    settings where it says nothing), so that it reads the same whatever the settings
    of the client reading it; a minimum the policy ignores is ``null``, e.g.
    ``{"policy":"rack-aware","min_racks_per_write_quorum":3,
    "min_regions_per_write_quorum":null,"enforce":true}``."""
    policy, racks, regions, enforce = spec.resolve(config)
    return json.dumps({"policy": policy, "min_racks_per_write_quorum": racks or None,
                       "min_regions_per_write_quorum": regions or None,
                       "enforce": enforce}, separators=(",", ":")).encode()


def ledger_placement(md: LedgerMetadata) -> PlacementSpec | None:
    """The placement ``md``'s ledger was created with (``create_ledger(placement=...)``,
    recorded under :data:`PLACEMENT_KEY`), None when it was created without one (it
    follows whichever client places its bookies).  Pure.  A ``null`` or absent minimum
    reads as None (the reading client's setting; the policy ignores it anyway when it
    was written by :func:`placement_record`).  Raises ValueError, naming the ledger,
    the key and the value, when the value is not such a record (hand-edited metadata):
    callers fall back to their own policy with a warning."""
    raw = md.custom.get(PLACEMENT_KEY)
    if raw is None:
        return None
    try:
        value = json.loads(raw.decode("utf-8"))
        if not isinstance(value, dict):
            raise ValueError(f"a JSON object is needed, not {type(value).__name__}")
        unknown = sorted(set(value) - set(_RECORD_FIELDS))
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(map(repr, unknown))}")
        if value.get("policy") is None:
            raise ValueError("'policy' is missing")
        return PlacementSpec(**{_RECORD_FIELDS[k]: v for k, v in value.items()})
    except (ValueError, TypeError) as exc:  # JSONDecodeError, UnicodeDecodeError too
        raise ValueError(f"ledger {md.ledger_id}: custom metadata {PLACEMENT_KEY} = "
                         f"{raw[:200]!r} is not a placement record: {exc}") from exc


class _CountedPolicy:
    """A ledger-specific policy whose fallbacks also count in the client's
    (``BookKeeper.placement.fallbacks`` is every placement the client made)."""

    def __init__(self, inner: PlacementPolicy, total: PlacementPolicy) -> None:
        self.inner = inner
        self._total = total
        self.fallbacks = 0

    def _count(self, before: int) -> None:
        missed = self.inner.fallbacks - before
        if missed:
            self.fallbacks += missed
            self._total.fallbacks += missed

    def new_ensemble(self, size: int, write_quorum: int, writable: Collection[BookieId],
                     locations: Mapping[BookieId, str],
                     exclude: Collection[BookieId] = ()) -> list[BookieId]:
        before = self.inner.fallbacks
        try:
            return self.inner.new_ensemble(size, write_quorum, writable, locations, exclude)
        finally:
            self._count(before)

    def replace(self, ensemble: Sequence[BookieId], positions: Sequence[int],
                write_quorum: int, writable: Collection[BookieId],
                locations: Mapping[BookieId, str],
                exclude: Collection[BookieId] = ()) -> list[BookieId]:
        before = self.inner.fallbacks
        try:
            return self.inner.replace(ensemble, positions, write_quorum, writable, locations,
                                      exclude)
        finally:
            self._count(before)


class BookKeeper:
    """A connected asyncbk client (see the README).  Use ``await BookKeeper.connect(uri)``."""

    def __init__(self, meta: MetadataStore, config: ClientConfig, *,
                 connector: Connector | None = None, rng: random.Random | None = None,
                 ssl: ssl_module.SSLContext | None = None, token: str | None = None,
                 rack_mapping: RackMapping | None = None,
                 tracing: Tracing | None = None) -> None:
        self.meta = meta
        self.config = config
        self.bookie_client = BookieClient(
            frame_bytes_max=config.frame_bytes_max,
            requests_max=config.connection_requests_max,
            connect_timeout_s=config.connect_timeout_s,
            reconnect_backoff_s_max=config.reconnect_backoff_s_max,
            write_buffer_bytes_max=config.connection_write_buffer_bytes_max,
            connector=connector or tcp_connector(config.bookie_addresses, ssl),
            token=token.encode() if token is not None else None,
        )
        self._log = get_logger()
        self.placement: PlacementPolicy = make_policy(
            config.placement_policy, min_racks_per_write_quorum=config.min_racks_per_write_quorum,
            min_regions_per_write_quorum=config.min_regions_per_write_quorum,
            enforce=config.enforce_placement, rng=rng, log=self._log)
        """Chooses ensembles and replacements (``placement_policy``)."""
        self._rng = rng
        self._placements: dict[tuple[str, int, int, bool], PlacementPolicy] = {
            PlacementSpec().resolve(config): self.placement}
        """The policies of ``create_ledger(placement=...)``, one per distinct setting."""
        self.quarantine = Quarantine(config.bookie_quarantine_s)
        self.stats = ClientStats()
        self.bookies = BookieWatcher(
            meta, self._on_bookie_registered, static_locations=config.bookie_racks,
            rack_mapping=rack_mapping if rack_mapping is not None
            else RackMapping.from_config(config), refresh_s=config.bookie_racks_refresh_s)
        self.context = ClientContext(meta=meta, config=config, bookie_client=self.bookie_client,
                                     bookies=self.bookies, placement=self.placement,
                                     quarantine=self.quarantine, stats=self.stats,
                                     tracing=tracing if tracing is not None else
                                     Tracing.from_global() if config.tracing else None)
        """What handles and recoveries are given (they never hold the client)."""
        self.objects = ObjectStores(
            credentials_file=config.object_store_credentials_file or None)
        """The object stores offloaded segments are read from, opened on first use."""
        self._closed = False

    def _on_bookie_registered(self, bookie: BookieId, session: Any) -> None:
        """A bookie registered anew (e.g. restarted): it may be used again at once."""
        if self.quarantine.release_if_new_session(bookie, session):
            self._log.info("bookie registered anew, quarantine lifted", bookie=bookie)
        self.bookie_client.reset_backoff(bookie)

    def placement_for(self, spec: PlacementSpec | None) -> PlacementPolicy:
        """The policy for ``spec`` (None: the client's own, :attr:`placement`): one per
        distinct setting, kept for the client's life."""
        if spec is None:
            return self.placement
        if not isinstance(spec, PlacementSpec):
            raise TypeError(f"placement must be a PlacementSpec, not {type(spec).__name__}")
        key = spec.resolve(self.config)
        policy = self._placements.get(key)
        if policy is None:
            name, racks, regions, enforce = key
            policy = self._placements[key] = _CountedPolicy(make_policy(
                name, min_racks_per_write_quorum=racks or 1,
                min_regions_per_write_quorum=regions or 1, enforce=enforce, rng=self._rng,
                log=self._log), self.placement)
        return policy

    def quarantine_bookie(self, bookie: BookieId) -> None:
        """Keep ``bookie``, which just failed, out of ensembles for a while."""
        self.context.quarantine_bookie(bookie)

    async def release_healthy(self, bookies: Collection[BookieId]) -> set[BookieId]:
        """Lift the quarantine of those of ``bookies`` that answer as writable (see
        :meth:`ClientContext.release_healthy`)."""
        return await self.context.release_healthy(bookies)

    @classmethod
    async def connect(cls, metadata_uri: str, *, ssl: ssl_module.SSLContext | None = None,
                      token: str | None = None, etcd_ssl: ssl_module.SSLContext | None = None,
                      etcd_user: str | None = None, etcd_password: str | None = None,
                      tracer_provider: Any = None, **options: Any) -> Self:
        """Connect to the cluster whose metadata lives at ``metadata_uri``
        (``etcd://host:port[,host:port...]/<root>``, ``etcds://`` for etcd over TLS).

        ``ssl``: TLS to the bookies (a client context: the CA that signed them, and
        this client's certificate where they require one); with an ``etcds://`` URI
        also to etcd, unless ``etcd_ssl`` is given.  ``token``: what bookies started
        with ``--auth-tokens-file`` ask for.  ``etcd_user`` and ``etcd_password``:
        etcd's own authentication.  ``tracer_provider``: an OpenTelemetry tracer
        provider to trace with (sets ``tracing``; default: the global one when
        ``tracing=True``).  ``options`` are ClientConfig fields."""
        if token is not None and (not isinstance(token, str) or not token):
            raise TypeError("token must be a non-empty str")
        for name, value in (("etcd_user", etcd_user), ("etcd_password", etcd_password)):
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"{name} must be a non-empty str")
        if tracer_provider is not None:
            options = {**options, "tracing": True}
        config = from_mapping(ClientConfig, options, "BookKeeper.connect options")
        tracing = None  # (without the otel extra: MissingExtraError before connecting)
        if tracer_provider is not None:
            tracing = Tracing.from_provider(tracer_provider)
        elif config.tracing:
            tracing = Tracing.from_global()
        rack_mapping = RackMapping.from_config(config)
        if rack_mapping is not None:  # a bad rack file: ConfigError before connecting
            await rack_mapping.load()
        if etcd_ssl is None and metadata_uri.strip().lower().startswith("etcds://"):
            etcd_ssl = ssl
        meta = await open_metadata_store(metadata_uri, timeout_s=config.metadata_timeout_s,
                                         ssl=etcd_ssl, user=etcd_user, password=etcd_password)
        bk = cls(meta, config, ssl=ssl, token=token, rack_mapping=rack_mapping,
                 tracing=tracing)
        bk.bookies.start()
        log_build_once(bk._log)
        return bk

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.bookies.close()
        await self.bookie_client.close()
        await self.meta.close()

    # ------------------------------------------------------------------ ledgers

    async def create_ledger(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        digest: str = "xxh3",
        password: bytes = b"",
        metadata: dict[str, bytes] | None = None,
        *,
        placement: PlacementSpec | None = None,
    ) -> LedgerHandle:
        """A new OPEN ledger, writable through the returned handle only.

        ``placement``: how this ledger's ensemble, and the replacements its writer
        picks later, are chosen, instead of the client's settings (its fields left
        None are the client's).  It is recorded in the ledger's custom metadata
        (:data:`PLACEMENT_KEY`, resolved against this client's settings), so that
        auto-recovery, ``asyncbk shell recover`` and the placement check use it too,
        whatever their own settings.  ``metadata`` may not use that key (ValueError);
        without ``placement`` nothing is added."""
        if not (ensemble_size >= write_quorum >= ack_quorum >= 1):
            raise ValueError(
                f"need ensemble_size >= write_quorum >= ack_quorum >= 1, got "
                f"{ensemble_size}/{write_quorum}/{ack_quorum}")
        if digest not in DIGESTS:
            raise ValueError(f"unknown digest {digest!r}; choose one of {', '.join(DIGESTS)}")
        if not isinstance(password, bytes):
            raise TypeError("password must be bytes")
        policy = self.placement_for(placement)
        custom = dict(metadata or {})
        for k, v in custom.items():
            if not isinstance(k, str) or not isinstance(v, bytes):
                raise TypeError("custom metadata must map str to bytes")
        if PLACEMENT_KEY in custom:
            raise ValueError(f"custom metadata key {PLACEMENT_KEY!r} is reserved: it records "
                             "the ledger's placement; pass placement=PlacementSpec(...) "
                             "instead")
        if placement is not None:
            custom[PLACEMENT_KEY] = placement_record(placement, self.config)
        writable = await self.bookies.writable(self.config.metadata_timeout_s)
        if len(writable) < ensemble_size:
            raise NotEnoughBookiesError(
                f"need {ensemble_size} writable bookies, {len(writable)} registered"
                + (f" ({', '.join(writable)})" if writable else "")
                + "; start more bookies or lower ensemble_size")
        quarantined = self.quarantine.active()
        if len(set(writable) - quarantined) < ensemble_size:
            quarantined = set()  # a new ledger may use a recently failed bookie, not wait
        ensemble = policy.new_ensemble(ensemble_size, write_quorum, writable,
                                       self.bookies.locations(), exclude=quarantined)
        ledger_id = await self.meta.allocate_ledger_id()
        md = new_metadata(ledger_id, ensemble, write_quorum, ack_quorum, digest, password, custom,
                          int(time.time() * 1000))
        md = await self.meta.create_ledger(md)
        self._log.info("ledger created", ledger_id=ledger_id, ensemble=list(ensemble),
                       write_quorum=write_quorum, ack_quorum=ack_quorum)
        return LedgerHandle(self.context, md, password, placement=policy)

    async def open_ledger(self, ledger_id: int, password: bytes = b"",
                          recovery: bool = True) -> ReadHandle:
        """Open for reading.  ``recovery=True`` fences the ledger, recovers its last
        entries and closes it; ``recovery=False`` neither fences nor closes (tailing)."""
        md = await self.meta.read_ledger(ledger_id)
        if not hmac.compare_digest(md.password, password):
            if not password:
                raise UnauthorizedAccessError(
                    f"ledger {ledger_id} has a password and none was given: pass "
                    "password=... to open_ledger")
            raise UnauthorizedAccessError(f"ledger {ledger_id}: wrong password")
        if recovery and md.state is not LedgerState.CLOSED:
            md = await LedgerRecoveryOp(self.context, md, password).run()
        handle = ReadHandle(self.context, md, password)
        if not md.is_closed:
            try:
                await handle.read_last_add_confirmed()
            except UnauthorizedAccessError:
                raise  # every bookie refused this client: reads would fail too
            except BKError as exc:
                self._log.warning("could not read the LAC at open", ledger_id=ledger_id,
                                  error=str(exc))
        return handle

    async def delete_ledger(self, ledger_id: int) -> None:
        """Remove the ledger's metadata; bookies reclaim its space later."""
        await self.meta.delete_ledger(ledger_id)
        self._log.info("ledger deleted", ledger_id=ledger_id)

    async def list_ledgers(self) -> AsyncIterator[int]:
        async for ledger_id in self.meta.iter_ledger_ids():
            yield ledger_id

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return await self.meta.read_ledger(ledger_id)

    def bookie_locations(self) -> dict[BookieId, str]:
        """The network location (``/region/rack``) of every bookie this client knows
        (normalized).  For each bookie the first that gives one wins: ``bookie_racks``
        (static), then the rack file (``bookie_racks_file``), then the rack script
        (``bookie_racks_script``), then what the bookie registered (its ``--rack``);
        others are in ``/default-region/default-rack``.  The file and the script are
        consulted again whenever the registry changes and every
        ``bookie_racks_refresh_s``."""
        return dict(self.bookies.locations())
