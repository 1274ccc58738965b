"""Exception hierarchy of asyncbk.

Every error a user can see is a subclass of :class:`BKError`.  Names follow
Apache BookKeeper's client exceptions.  Each class says whether the same call may
succeed if made again later (``retriable``, as aiokafka's errors do): True for
conditions that pass (bookies or the metadata store unreachable, a bound reached, a
lost compare-and-swap race), False where retrying cannot help (fenced, closed, no
such ledger, bad input).  :func:`is_retriable` reads it from any exception.

``ProtocolError`` and ``InvariantError`` are internal: the first rejects bad wire input, the second
reports a broken internal invariant (a bug), and neither is caught silently.
"""

from __future__ import annotations

import builtins


class BKError(Exception):
    """Base class of every asyncbk error."""

    retriable: bool = False
    """Whether the same call may succeed if made again later (after a back-off)."""


class NotEnoughBookiesError(BKError):
    """Fewer writable bookies are registered than the ensemble needs."""

    retriable = True


class PlacementError(NotEnoughBookiesError):
    """An enforced placement constraint (racks or regions per write set) cannot be met
    with the bookies available; the message says which, and what was available."""


class LedgerFencedError(BKError):
    """The ledger was fenced by a recovery: this writer can add nothing more."""


class LedgerClosedError(BKError):
    """The ledger is closed (or closing): appends are refused."""


class NoSuchLedgerError(BKError):
    """No ledger with that id exists (in metadata, or on a bookie)."""


class NoSuchEntryError(BKError):
    """The entry is not stored on the bookie asked."""


class ReadBeyondLastAddConfirmedError(BKError):
    """A read asked for entries past the last add confirmed."""

    retriable = True


class UnauthorizedAccessError(BKError):
    """Wrong password for the ledger."""


class DigestMismatchError(BKError):
    """No replica returned an entry whose digest verifies."""


class BookieUnavailableError(BKError):
    """A bookie could not be reached, or its connection was lost."""

    retriable = True


class MetadataVersionError(BKError):
    """A compare-and-swap on metadata lost against a concurrent change."""

    retriable = True


class TimeoutError(BKError, builtins.TimeoutError):
    """An operation did not complete within its time limit."""

    retriable = True


class EntryTooLargeError(BKError, ValueError):
    """An entry larger than a bookie frame can carry (``frame_bytes_max``)."""


class BookieReadOnlyError(BKError):
    """The bookie is read-only and refuses adds."""

    retriable = True


class TooManyRequestsError(BKError):
    """A bound was reached (bookie queue, client in-flight window); retry later."""

    retriable = True


class BadRequestError(BKError):
    """The bookie rejected a request as malformed."""


class BookieIOError(BKError):
    """The bookie hit an I/O error serving the request."""

    retriable = True


class MetadataError(BKError):
    """The metadata store failed or answered something unexpected."""

    retriable = True


class CookieError(BKError):
    """A bookie's directories do not match its registered identity (cookie)."""


class ConfigError(BKError):
    """A configuration file or option is invalid."""


class MissingExtraError(ConfigError, ImportError):
    """A feature needs an optional package that is not installed: the one-line message
    names the package and the extra that installs it (``pip install 'asyncbk[EXTRA]'``;
    made by :meth:`of`).  Also an ImportError (``name``: the missing package), for code
    that guards an optional import that way."""

    extra: str = ""
    """The extra that installs the package (``lmdb``, ``standalone``, ``spark``)."""

    @classmethod
    def of(cls, feature: str, package: str, extra: str) -> MissingExtraError:
        """``<feature> needs the <package> package, which is not installed: pip install
        'asyncbk[<extra>]'``."""
        err = cls(f"{feature} needs the {package} package, which is not installed: "
                  f"pip install 'asyncbk[{extra}]'", name=package)
        err.extra = extra
        return err


class NoSuchNamespaceError(BKError):
    """No namespace of that name exists."""


class NamespaceExistsError(BKError):
    """A namespace of that name exists already."""


class NamespaceNotEmptyError(BKError):
    """The namespace still holds streams (delete them, or pass ``force=True``)."""


class NoSuchStreamError(BKError):
    """No stream of that name exists in the namespace."""


class StreamExistsError(BKError):
    """A stream of that name exists already in the namespace."""


class InvalidNameError(BKError, ValueError):
    """A namespace or stream name that is empty, too long or badly formed."""


class InvalidTxidError(BKError, ValueError):
    """A stream record's txid is negative, not an int, or less than the previous one."""


class WriterFencedError(BKError):
    """Another writer opened the stream: this writer can write nothing more."""


class TruncatedError(BKError):
    """The position asked for was truncated away (or dropped by retention)."""


class EndOfStreamError(BKError):
    """The stream was marked ended and every record has been read (or a write was
    attempted after the end)."""


class NoSuchSubscriptionError(BKError):
    """No subscription of that name exists on the stream."""


class SubscriptionFencedError(BKError):
    """Another consumer subscribed with the same name (or the subscription was sought
    or deleted): this consumer's acknowledgements no longer count."""


class InvalidAckError(BKError, ValueError):
    """An acknowledgement of a position this consumer was never delivered, or below
    one it acknowledged already: nothing changed."""


class CorruptRecordError(BKError):
    """A stream entry that does not decode as a batch of records (not written by a
    stream writer, or damaged)."""


class ObjectStoreError(BKError):
    """An object-store request failed (tiered storage): the message names the store
    and the object."""


class ObjectStoreUnavailableError(ObjectStoreError):
    """The object store did not answer in time, answered 5xx, or could not be reached;
    the same request may succeed later."""

    retriable = True


class ObjectStoreAuthError(ObjectStoreError):
    """The object store refused the credentials (or they are missing)."""


class ObjectNotFoundError(ObjectStoreError):
    """No such object, or no such bucket."""


class CorruptObjectError(ObjectStoreError, CorruptRecordError):
    """An offloaded segment's object does not match its format or checksums (damaged,
    or not an asyncbk segment object)."""


class ProtocolError(Exception):
    """Bad wire input: an oversized, truncated or malformed frame or message."""


class InvariantError(AssertionError):
    """An internal invariant does not hold: a bug in asyncbk."""


def is_retriable(exc: BaseException) -> bool:
    """Whether the call that raised ``exc`` may succeed if made again later: an
    asyncbk error's ``retriable``; for anything else False."""
    return bool(getattr(exc, "retriable", False)) if isinstance(exc, BKError) else False


def invariant(condition: bool, message: str) -> None:
    """An always-on assertion (not stripped by ``python -O``)."""
    if not condition:
        raise InvariantError(message)
