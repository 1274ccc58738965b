"""TLS contexts and tokens for bookies and their clients.

* :func:`server_context`: a bookie's TLS (its certificate and key; with a CA, it
  checks client certificates, and requires one with ``require_client_cert``).
* :func:`client_context`: a client's TLS (the CA that signed the bookies, and the
  client's own certificate where bookies require one).  Hostname checking is on:
  a bookie's certificate must name the host of its id.
* :func:`load_tokens` / :func:`read_token`: tokens come from files (one per line;
  blank lines and ``#`` comments skipped) or the environment, never from command
  lines, and no error message or log line ever holds one.
* :class:`LiveServerTLS` and :class:`CredentialReloader`: a running server takes a
  renewed certificate, key, CA or tokens file without a restart (on request, e.g.
  SIGHUP, and when the files change, checked every :data:`RELOAD_CHECK_S`).
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..clock import SYSTEM_CLOCK, Clock
from ..errors import ConfigError
from ..log import get_logger

TOKEN_ENV = "ASYNCBK_AUTH_TOKEN"
"""The environment variable a client's token may come from."""


def _readable(path: str, what: str) -> str:
    if not Path(path).is_file():
        raise ConfigError(f"{what} {path!r}: no such file")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{what} {path!r}: not readable by this user")
    return path


def server_context(cert_file: str, key_file: str, ca_file: str = "",
                   require_client_cert: bool = False) -> ssl.SSLContext:
    """TLS for a server (TLS 1.2 or newer)."""
    if require_client_cert and not ca_file:
        raise ConfigError("requiring client certificates needs the CA that signs them "
                          "(--tls-ca)")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(_readable(cert_file, "TLS certificate"),
                            _readable(key_file, "TLS key"))
        if ca_file:
            ctx.load_verify_locations(_readable(ca_file, "TLS CA file"))
    except ssl.SSLError as exc:
        raise ConfigError(f"TLS material unusable ({exc.reason or exc}): check that the "
                          "certificate, its key and the CA are PEM files that belong "
                          "together") from None
    ctx.verify_mode = (ssl.CERT_REQUIRED if require_client_cert
                       else ssl.CERT_OPTIONAL if ca_file else ssl.CERT_NONE)
    return ctx


def client_context(ca_file: str = "", cert_file: str = "", key_file: str = "",
                   check_hostname: bool = True) -> ssl.SSLContext:
    """TLS for a client: ``ca_file`` (else the system's CAs) checks the server; the
    client's own certificate with ``cert_file`` and ``key_file``."""
    if bool(cert_file) != bool(key_file):
        raise ConfigError("a client certificate needs both its file and its key file")
    try:
        ctx = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH, cafile=_readable(ca_file, "TLS CA file") if ca_file
            else None)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if cert_file:
            ctx.load_cert_chain(_readable(cert_file, "TLS certificate"),
                                _readable(key_file, "TLS key"))
    except ssl.SSLError as exc:
        raise ConfigError(f"TLS material unusable ({exc.reason or exc})") from None
    ctx.check_hostname = check_hostname
    return ctx


def load_tokens(path: str) -> list[bytes]:
    """The tokens in ``path`` (one per line; blank lines and ``# comments`` skipped)."""
    try:
        text = Path(_readable(path, "tokens file")).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"tokens file {path!r} unreadable: {type(exc).__name__}") from None
    tokens = [line.strip().encode() for line in text.splitlines()
              if line.strip() and not line.strip().startswith("#")]
    if not tokens:
        raise ConfigError(f"tokens file {path!r} holds no token (one per line)")
    return tokens


def read_token(path: str = "", env: str = TOKEN_ENV) -> str | None:
    """A client's token: the first in ``path``, else the environment variable ``env``,
    else None."""
    if path:
        return load_tokens(path)[0].decode()
    value = os.environ.get(env, "").strip()
    return value or None


# ---------------------------------------------------------------- reloading

RELOAD_CHECK_S = 30.0
"""How often a :class:`CredentialReloader` looks at its files (mtime, size, inode)."""


class LiveServerTLS:
    """A listening socket's TLS whose certificate, key and CA can be replaced while it
    listens.

    ``asyncio``'s ``create_server(ssl=...)`` (and aiohttp's site) keep the context they
    were given, so :attr:`context` (the first one) is what they get, and its SNI
    callback, which OpenSSL calls for every handshake (with or without a server name),
    moves each new connection onto the newest context (:meth:`swap`): its
    certificate, key and CA (the trust store that checks client certificates).  What
    the listening context decides at the start of a handshake stays as it was
    (protocol versions, whether a client certificate is asked for): those come from
    the configuration, not from the files.  Connections already made keep the
    material they were made with."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        """What the listener was given (never changes)."""
        self.current = context
        """What new connections use."""
        context.sni_callback = self._on_client_hello

    def swap(self, context: ssl.SSLContext) -> None:
        """New connections use ``context`` from now on (connections being made or
        made already are untouched)."""
        self.current = context

    def _on_client_hello(self, conn: ssl.SSLObject, server_name: str | None,
                         listening: ssl.SSLContext) -> None:
        current = self.current
        if current is not listening:
            conn.context = current


FileSignature = tuple[tuple[str, int, int, int] | None, ...]
"""Per file: (path, mtime in ns, size, inode), or None when it cannot be stat'ed."""


def file_signature(paths: Sequence[str]) -> FileSignature:
    """What tells whether ``paths`` changed (blocking: call it off the event loop)."""
    out: list[tuple[str, int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
        else:
            out.append((path, st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


@dataclass
class Credential:
    """One set of credentials a :class:`CredentialReloader` keeps up to date.

    ``load`` reads and checks the files (in a worker thread; raises
    :class:`ConfigError` saying what is wrong, without the secrets themselves);
    ``apply`` puts what it returned in use (on the event loop; must not fail)."""

    what: str
    """How logs name it: ``"TLS material"``, ``"tokens"``."""
    files: tuple[str, ...]
    load: Callable[[], Any]
    apply: Callable[[Any], None]


class CredentialReloader:
    """Reloads credentials (certificates and keys, tokens) while a server runs.

    * :meth:`request_reload` (a SIGHUP handler): every credential, now;
    * every ``check_s`` (:data:`RELOAD_CHECK_S`), the credentials whose files changed
      (mtime, size or inode: an edit in place, a copy, or a renamed file).

    Files are read off the event loop.  Unusable material (unreadable, a key that
    does not match its certificate, an empty tokens file, ...) changes nothing: the
    old material stays in use, and a warning says what is wrong (never a token or
    a key).  Until the files change again, polling does not try them again (a
    request does).  Reloads run one at a time.

    Owns its polling task and, after a request, one reload task; :meth:`close`
    cancels both."""

    def __init__(self, credentials: Sequence[Credential], *, clock: Clock = SYSTEM_CLOCK,
                 log: Any = None, check_s: float = RELOAD_CHECK_S) -> None:
        self.credentials = list(credentials)
        self.clock = clock
        self.log = log if log is not None else get_logger()
        self.check_s = check_s
        self._seen: dict[str, FileSignature] = {}
        self._lock = asyncio.Lock()
        self._poll_task: asyncio.Task[None] | None = None
        self._request_task: asyncio.Task[None] | None = None
        self._requested = False
        self._closed = False
        self.reloads = 0
        """Reloads that put new material in use."""
        self.failures = 0
        """Reloads refused (the old material kept)."""

    async def snapshot(self) -> None:
        """Note the files as they are now: call it before the server first reads them,
        so that a change made meanwhile is reloaded at the first check."""
        for cred in self.credentials:
            self._seen[cred.what] = await asyncio.to_thread(file_signature, cred.files)

    def start(self) -> None:
        """Start polling (after :meth:`snapshot` and once the server uses the material)."""
        if self._poll_task is None and not self._closed and self.credentials:
            self._poll_task = asyncio.get_running_loop().create_task(self._poll())
            self._poll_task.add_done_callback(self._task_done)

    @property
    def started(self) -> bool:
        return self._poll_task is not None and not self._closed

    def request_reload(self) -> None:
        """Reload every credential soon (for a signal handler: returns at once).
        Requests made while one runs make one more reload, not one each."""
        if not self.started:
            self.log.info("credential reload requested before the server started: "
                          "the files are checked once it runs")
            return
        self._requested = True
        if self._request_task is None or self._request_task.done():
            self._request_task = asyncio.get_running_loop().create_task(self._run_requests())
            self._request_task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.log.error("credential reload failed", error=repr(task.exception()))

    async def _run_requests(self) -> None:
        while self._requested:
            self._requested = False
            await self.reload()

    async def reload(self, changed_only: bool = False) -> dict[str, bool]:
        """Reload every credential (or only those whose files changed since they were
        last read); per credential tried, whether new material is in use."""
        results: dict[str, bool] = {}
        async with self._lock:
            for cred in self.credentials:
                signature = await asyncio.to_thread(file_signature, cred.files)
                if changed_only and signature == self._seen.get(cred.what):
                    continue
                self._seen[cred.what] = signature  # taken before reading: a later
                results[cred.what] = await self._reload_one(cred)  # change is seen
        return results

    async def _reload_one(self, cred: Credential) -> bool:
        try:
            material = await asyncio.to_thread(_load_checked, cred)
        except ConfigError as exc:
            self.failures += 1
            self.log.warning(f"{cred.what} not reloaded: the old stays in use",
                             error=str(exc), files=list(cred.files))
            return False
        cred.apply(material)
        self.reloads += 1
        self.log.info(f"{cred.what} reloaded", files=list(cred.files))
        return True

    async def _poll(self) -> None:
        while True:
            await self.clock.sleep(self.check_s)
            await self.reload(changed_only=True)

    async def close(self) -> None:
        self._closed = True
        tasks = [t for t in (self._poll_task, self._request_task) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._poll_task = self._request_task = None


def _load_checked(cred: Credential) -> Any:
    """``cred.load()``, with what a file changing under it may raise (gone between
    the check and the read, half written) said as a ConfigError."""
    try:
        return cred.load()
    except ConfigError:
        raise
    except (OSError, ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else ""
        raise ConfigError(f"{cred.what} unusable: {type(exc).__name__}"
                          + (f" ({detail})" if detail else "")) from None
