"""Exception hierarchy of asyncbk.

Every error a user can see is a subclass of :class:`BKError`.  Names follow
Apache BookKeeper's client exceptions.  ``ProtocolError`` and
``InvariantError`` are internal: the first rejects bad wire input, the second
reports a broken internal invariant (a bug), and neither is caught silently.
"""

from __future__ import annotations

import builtins


class BKError(Exception):
    """Base class of every asyncbk error."""


class NotEnoughBookiesError(BKError):
    """Fewer writable bookies are registered than the ensemble needs."""


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


class UnauthorizedAccessError(BKError):
    """Wrong password for the ledger."""


class DigestMismatchError(BKError):
    """No replica returned an entry whose digest verifies."""


class BookieUnavailableError(BKError):
    """A bookie could not be reached, or its connection was lost."""


class MetadataVersionError(BKError):
    """A compare-and-swap on metadata lost against a concurrent change."""


class TimeoutError(BKError, builtins.TimeoutError):
    """An operation did not complete within its time limit."""


class EntryTooLargeError(BKError, ValueError):
    """An entry larger than a bookie frame can carry (``frame_bytes_max``)."""


class BookieReadOnlyError(BKError):
    """The bookie is read-only and refuses adds."""


class TooManyRequestsError(BKError):
    """A bound was reached (bookie queue, client in-flight window); retry later."""


class BadRequestError(BKError):
    """The bookie rejected a request as malformed."""


class BookieIOError(BKError):
    """The bookie hit an I/O error serving the request."""


class MetadataError(BKError):
    """The metadata store failed or answered something unexpected."""


class CookieError(BKError):
    """A bookie's directories do not match its registered identity (cookie)."""


class ConfigError(BKError):
    """A configuration file or option is invalid."""


class ProtocolError(Exception):
    """Bad wire input: an oversized, truncated or malformed frame or message."""


class InvariantError(AssertionError):
    """An internal invariant does not hold: a bug in asyncbk."""


def invariant(condition: bool, message: str) -> None:
    """An always-on assertion (not stripped by ``python -O``)."""
    if not condition:
        raise InvariantError(message)
