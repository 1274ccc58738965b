"""What the ``asyncbk`` commands share.

* Errors and exit codes: :class:`CliError` (printed as one line, exit code 1) and
  :func:`one_line_errors`, which turns it, the library's errors and the like into that
  one line on stderr;
* the parsers: :class:`Parser` (a usage error names ``--help``),
  :class:`DefaultsFormatter`, the argument value types (:func:`positive_int` ...
  :func:`port`), ``--log-level`` / ``--log-json`` and :func:`configure_logging`;
* a command's client: its placement options (:func:`add_client_placement_options`,
  :func:`client_placement_options`, :func:`client_options`), :func:`connect_client`
  (with the TLS and token options of :mod:`.security`) and :func:`require_cluster`;
* running: :func:`run_async` (the event loop of a command), :func:`on_stop_signals`;
* ``--check-config``, the dry run of the server commands (``bookie``,
  ``autorecovery``, ``offload``): :func:`add_check_config_option`,
  :class:`FileCheck`, :func:`dry_run`;
* the terminal: :func:`read_line`, :func:`confirm`, :func:`progress`;
* :class:`LedgerLocks`: the ledger locks of the commands that change ledgers
  (``shell recover``, ``decommission``, ``placementcheck --fix``).

Nothing here imports a command module: the commands import this one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn, TypeAlias

from ..errors import BKError, ConfigError
from .security import client_security

EXIT_USAGE = 2
"""Bad arguments (argparse's own exit code), or no command given."""
EXIT_ERROR = 1
"""The command failed: one line on stderr says why."""
EXIT_INTERRUPTED = 130
"""Stopped by Ctrl-C (128 + SIGINT)."""
EXIT_CONFIG_REFUSED = EXIT_USAGE
"""``--check-config``: the settings were refused (bad input, as a usage error is)."""


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 1."""


ONE_LINE_ERRORS = (CliError, BKError, ConfigError, ValueError, OSError)
"""The errors a command reports as one line on stderr (exit code 1), without a
traceback; anything else is a bug and keeps its traceback."""


@contextlib.contextmanager
def one_line_errors(prog: str) -> Iterator[None]:
    """Run a command: an error of :data:`ONE_LINE_ERRORS` exits with ``prog: error:
    ...`` on stderr and :data:`EXIT_ERROR`; Ctrl-C exits with :data:`EXIT_INTERRUPTED`."""
    try:
        yield
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    except ONE_LINE_ERRORS as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_ERROR)


def count_text(n: int, noun: str) -> str:
    """``n`` of ``noun``, in words: "1 bookie", "12,345 records"."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


# ------------------------------------------------------------------ parsers


class Parser(argparse.ArgumentParser):
    """A parser whose usage errors end by naming ``--help`` (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None,
                         ) -> tuple[argparse.Namespace, list[str]]:
        """As argparse's, but arguments a (sub)command does not know are its error, so
        the message names that subcommand's ``--help`` rather than the top command's."""
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that shows every option's default (unless its text already speaks of one)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if ("default" in text or not action.option_strings
                or action.default in (None, argparse.SUPPRESS)):
            return text
        return f"{text} (default: %(default)s)"


Subparsers: TypeAlias = "argparse._SubParsersAction[Parser]"
"""What ``add_subparsers(parser_class=Parser)`` returns: each command module's
``add_parser(subparsers)`` registers its command on it."""


def add_log_options(p: argparse.ArgumentParser) -> None:
    """``--log-level`` and ``--log-json`` (see :func:`configure_logging`)."""
    p.add_argument("--log-level", default=None, choices=["debug", "info", "warning", "error"],
                   help="log level (default: info for servers, warning for tools)")
    p.add_argument("--log-json", action="store_true",
                   help="log JSON lines instead of text (default: text)")


def configure_logging(args: argparse.Namespace, default: str = "info") -> None:
    """Logging as ``--log-level`` (else ``default``) and ``--log-json`` say."""
    from ..log import configure

    configure(getattr(args, "log_level", None) or default, getattr(args, "log_json", False))


# ------------------------------------------------------------------ argument types
# Each refuses a bad value with a message argparse prints as ``error: argument --x: ...``.


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


def port(text: str) -> int:
    """A TCP port, 1..65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 1..65535, got {value}")
    return value


# ------------------------------------------------------------------ a command's client


def add_client_placement_options(p: argparse._ActionsContainer) -> None:
    """The placement settings of a command's client (ClientConfig fields of the same
    names; see docs/placement.md): ``--placement-policy``, ``--min-racks-per-write-
    quorum``, ``--min-regions-per-write-quorum``, ``--enforce-placement``,
    ``--bookie-racks-file``, ``--bookie-racks-script``."""
    from ..topology import POLICIES, RACK_FILE_FORMAT

    p.add_argument("--placement-policy", choices=POLICIES, default=None,
                   help="how this client chooses ensembles and replacement bookies "
                   "(default: random)")
    p.add_argument("--min-racks-per-write-quorum", type=positive_int, default=None,
                   metavar="N", help="rack- and region-aware: racks every write set spans "
                   "at least, capped at the write quorum (default: 2)")
    p.add_argument("--min-regions-per-write-quorum", type=positive_int, default=None,
                   metavar="N", help="region-aware: regions every write set spans at least, "
                   "capped at the write quorum (default: 2)")
    p.add_argument("--enforce-placement", action="store_true", default=None,
                   help="fail when the minimum racks/regions cannot be met (default: use "
                   "the best ensemble available, with a warning)")
    p.add_argument("--bookie-racks-file", metavar="FILE", default=None,
                   help=f"locate bookies by this file, lines {RACK_FILE_FORMAT.split(',')[0]} "
                   "('#' comments; a host matches any port), winning over "
                   "--bookie-racks-script and the bookies' --rack (default: none)")
    p.add_argument("--bookie-racks-script", metavar="COMMAND", default=None,
                   help="locate bookies by running COMMAND with bookie hosts as arguments; it "
                   "prints one location per host (default: none)")


PLACEMENT_OPTIONS = ("placement_policy", "min_racks_per_write_quorum",
                     "min_regions_per_write_quorum", "enforce_placement", "bookie_racks_file",
                     "bookie_racks_script")
"""The ClientConfig fields of :func:`add_client_placement_options`' options."""


def client_options(args: argparse.Namespace, names: tuple[str, ...], *,
                   read_rack_file: bool = True) -> dict[str, Any]:
    """The ClientConfig fields ``names`` that ``args`` gives (None: not given), checked
    (ConfigError); with ``read_rack_file``, a ``bookie_racks_file`` among them is read
    and parsed too, so a bad line is refused, naming ``file:line``, before anything is
    contacted.  Blocking: call it before the event loop runs."""
    from ..config import ClientConfig, from_mapping
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


def client_placement_options(args: argparse.Namespace, *, read_file: bool = False
                             ) -> dict[str, Any]:
    """The ClientConfig settings of the options of :func:`add_client_placement_options`
    that were given, checked (ConfigError); with ``read_file``, the rack file too
    (blocking: before the event loop runs)."""
    return client_options(args, PLACEMENT_OPTIONS, read_rack_file=read_file)


async def connect_client(args: argparse.Namespace, options: dict[str, Any] | None = None,
                         client: Any = None) -> Any:
    """A connected client of a command's options: ``--metadata-uri``, TLS and token
    (:mod:`.security`), and ``options`` (ClientConfig settings; default: those of
    :func:`add_client_placement_options`, where a bad rack file is refused, ConfigError
    naming file:line, before anything is contacted).  ``client`` is its class: the
    ledger client ``asyncbk.client.client.BookKeeper`` unless given (the stream
    commands give ``asyncbk.stream.client.BookKeeper``)."""
    if client is None:
        from ..client.client import BookKeeper

        client = BookKeeper
    if options is None:
        options = client_placement_options(args)
    security = await asyncio.to_thread(client_security, args)
    return await client.connect(args.metadata_uri, **security, **options)


async def require_cluster(bk: Any, uri: str) -> None:
    """Refuse to go on (CliError) when no asyncbk cluster lives under the URI's root:
    no cluster instance id (written when the first bookie of a cluster starts) and no
    bookie registered.  A wrong root otherwise looks like an empty cluster."""
    from ..meta.keys import instance_id

    if await bk.meta.kv_get(instance_id(bk.meta.root)) is not None:
        return
    if await bk.meta.list_bookies():
        return
    raise CliError(f"no asyncbk cluster at {uri}: no bookie ever started under root "
                   f"{bk.meta.root or '/'!r}. Check the root (the path of --metadata-uri; "
                   f"`asyncbk standalone` prints the URI)")


# ------------------------------------------------------------------ running


def run_async(coro_fn: Callable[[], Coroutine[Any, Any, int | None]]) -> int:
    """Run a command's coroutine on a new uvloop event loop; its exit code (None: 0)."""
    import uvloop

    return uvloop.run(coro_fn()) or 0


def on_stop_signals(callback: Callable[[], object]) -> None:
    """Call ``callback`` on SIGINT (Ctrl-C) and SIGTERM, on the running loop."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, callback)


# ------------------------------------------------------------------ --check-config

CHECK_MODES = ("files", "paths")
"""``--check-config`` MODE: ``files`` reads every file the settings name as a start
would; ``paths`` checks those settings as paths only (for a machine where the files,
mounted in production from Secrets, are absent)."""


def add_check_config_option(p: argparse._ActionsContainer) -> None:
    """``--check-config [MODE]`` (see :func:`dry_run`)."""
    p.add_argument("--check-config", nargs="?", const="files", choices=CHECK_MODES,
                   default=None, metavar="MODE",
                   help="check the settings (options, --config, the environment) as a start "
                   "would, without any network, print one line and exit: 0 when they "
                   "would start, 2 when not. MODE files (the default) also reads every "
                   "file they name (TLS material, tokens, passwords, credentials, rack "
                   "file) and checks the directories; paths checks those as paths only, "
                   "reading none (a --config file is read in both modes)")


class FileCheck:
    """How a dry run treats a file the settings name: read it (mode ``files``), or
    only check the path (mode ``paths``: not empty, no NUL or line break; counted in
    :attr:`unread`)."""

    def __init__(self, mode: str) -> None:
        if mode not in CHECK_MODES:
            raise ValueError(f"check mode must be one of {', '.join(CHECK_MODES)}")
        self.read = mode == "files"
        """Read the files (else: paths only)."""
        self.unread: list[str] = []
        """The settings whose files were not read (mode ``paths``)."""

    def path(self, what: str, path: str | None) -> bool:
        """Check ``path`` (None or empty: not set, nothing to check); True when the
        caller is to read the file (mode ``files``)."""
        if not path:
            return False
        if "\0" in path or "\n" in path or "\r" in path or path != path.strip():
            raise ConfigError(f"{what}: the path {path!r} has a NUL, a line break or "
                              "surrounding blanks")
        if not self.read:
            self.unread.append(what)
        return self.read

    def directory(self, what: str, path: str) -> None:
        """A directory a start creates if it is missing: with mode ``files``, an
        existing one must be a writable directory, a missing one must be creatable
        (its nearest existing parent a writable directory)."""
        if not self.path(what, path):
            return
        import os

        p = Path(path).absolute()
        if p.exists():
            if not p.is_dir():
                raise ConfigError(f"{what} {path!r} exists and is not a directory")
            if not os.access(p, os.W_OK | os.X_OK):
                raise ConfigError(f"{what} {path!r} is not writable by this user")
            return
        parent = next(a for a in p.parents if a.exists())
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(f"{what} {path!r} does not exist and cannot be created: "
                              f"{str(parent)!r} is not a writable directory")

    def summary(self) -> str:
        """How the files were checked, for the OK line."""
        if self.read:
            return "named files read, directories checked"
        return ("files checked as paths only, not read: " + ", ".join(self.unread)
                if self.unread else "no file named")


def dry_run(prog: str, check: Callable[[], str]) -> int:
    """Run ``check`` (the settings checked as a start would check them, no network;
    it returns a summary that holds no secret): ``prog: configuration OK: SUMMARY``
    on stdout and 0, or ``prog: error: configuration refused (TYPE): WHY`` on stderr
    and :data:`EXIT_CONFIG_REFUSED`.  The errors of :data:`ONE_LINE_ERRORS` never
    hold a token, password or key."""
    try:
        summary = check()
    except ONE_LINE_ERRORS as exc:
        print(f"{prog}: error: configuration refused ({type(exc).__name__}): {exc}",
              file=sys.stderr)
        return EXIT_CONFIG_REFUSED
    print(f"{prog}: configuration OK: {summary}", flush=True)
    return 0


def check_client_security(args: argparse.Namespace, files: FileCheck) -> str:
    """A command's client TLS, token and etcd settings (:mod:`.security`), checked as
    :func:`~.security.client_security` checks them, reading the files only with
    ``files.read``; a summary without secrets."""
    from ..net.etcd_security import PASSWORD_ENV, is_tls_uri
    from ..net.security import TOKEN_ENV

    def opt(name: str) -> str:
        return getattr(args, name, None) or ""

    uri = opt("metadata_uri")
    ca, cert, key = opt("tls_ca"), opt("tls_cert"), opt("tls_key")
    reading = [files.path("--tls-ca", ca), files.path("--tls-cert", cert),
               files.path("--tls-key", key), files.path("--auth-token-file",
                                                         opt("auth_token_file"))]
    e_ca, e_cert, e_key = opt("etcd_ca"), opt("etcd_cert"), opt("etcd_key")
    reading += [files.path("--etcd-ca", e_ca), files.path("--etcd-cert", e_cert),
                files.path("--etcd-key", e_key),
                files.path("--etcd-password-file", opt("etcd_password_file"))]
    if any(reading):
        client_security(args)  # reads and checks every file, as a start does
    else:
        check_etcd_rules(uri, bool(e_ca or e_cert or e_key),
                         (e_cert, e_key) if (e_ca or e_cert or e_key) else (cert, key),
                         opt("etcd_user"), opt("etcd_password_file"))
        if (ca or cert) and bool(cert) != bool(key):  # as client_context refuses it
            raise ConfigError("a client certificate needs both its file and its key file")
    import os

    token = ("token file" if opt("auth_token_file")
             else f"token from {TOKEN_ENV}" if os.environ.get(TOKEN_ENV, "").strip()
             else "no token")
    etcd = "etcd TLS" if is_tls_uri(uri) else "etcd plain"
    if opt("etcd_user"):
        etcd += (", etcd user with a password file" if opt("etcd_password_file")
                 else f", etcd user with {PASSWORD_ENV}")
    return f"TLS to bookies {'on' if ca or cert else 'off'}, {token}, {etcd}"


def check_etcd_rules(uri: str, own_tls: bool, cert_key: tuple[str, str], user: str,
                     password_file: str) -> None:
    """What :func:`~asyncbk.net.etcd_security.etcd_security` refuses before and
    beside reading its files, for a dry run that reads none (ConfigError)."""
    import os

    from ..net.etcd_security import PASSWORD_ENV, is_tls_uri

    if own_tls and not is_tls_uri(uri):
        raise ConfigError(f"--etcd-ca/--etcd-cert/--etcd-key were given, but the metadata URI "
                          f"{uri!r} is plain etcd://; write it etcds://... to use TLS")
    if is_tls_uri(uri) and bool(cert_key[0]) != bool(cert_key[1]):
        raise ConfigError("a client certificate needs both its file and its key file")
    if password_file and not user:
        raise ConfigError("--etcd-password-file needs --etcd-user (whose password it is)")
    if user and not password_file and not os.environ.get(PASSWORD_ENV, "").strip():
        raise ConfigError(f"etcd user {user!r} needs a password: --etcd-password-file FILE "
                          f"or the environment variable {PASSWORD_ENV}")


# ------------------------------------------------------------------ the terminal


async def read_line(stream: IO[str]) -> str:
    """One line from a terminal, without blocking the event loop ("" at end of input)."""
    loop = asyncio.get_running_loop()
    line: asyncio.Future[str] = loop.create_future()

    def readable() -> None:
        if not line.done():
            line.set_result(stream.readline())

    loop.add_reader(stream.fileno(), readable)
    try:
        return await line
    finally:
        loop.remove_reader(stream.fileno())


async def confirm(question: str, *, no_terminal: str, declined: str) -> None:
    """Ask ``question`` on the terminal before destroying something; go on only on
    "yes".  CliError(``no_terminal``) at once when stdin is not a terminal,
    CliError(``declined``) on any other answer."""
    if not sys.stdin.isatty():
        raise CliError(no_terminal)
    print(f"{question} This cannot be undone. Type yes to delete: ", end="", flush=True)
    answer = await read_line(sys.stdin)
    if answer.strip().lower() != "yes":
        raise CliError(declined)


PROGRESS_INTERVAL_S = 0.5
"""How often :func:`progress` prints, at most."""


def progress(prefix: str, unit: str = "entries copied") -> Callable[[int, int], None]:
    """``report(done, total)``: ``prefix: done/total unit`` on stderr, at most twice a
    second, the last one always."""
    last = [0.0]

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] > PROGRESS_INTERVAL_S:
            last[0] = now
            end = "\n" if done == total else ""
            print(f"\r{prefix}: {done}/{total} {unit}", end=end, file=sys.stderr,
                  flush=True)

    return report


# ------------------------------------------------------------------ ledger locks

LOCK_LEASE_TTL_S = 30
"""TTL of the lease the locks of :class:`LedgerLocks` are bound to: a command that dies
frees its locks this long after."""


class LedgerLocks:
    """Ledgers changed one at a time under their ``ledger-<id>`` lock (the one
    auto-recovery's workers take), bound to a lease kept alive while the command runs
    (``enabled=False``: no locks, for dry runs)."""

    def __init__(self, bk: Any, owner: str, enabled: bool = True) -> None:
        from ..autorecovery.service import LeaseKeeper
        from ..log import get_logger

        self._bk = bk
        self.owner = owner
        self._keeper = LeaseKeeper(bk.meta, LOCK_LEASE_TTL_S, get_logger(component=owner))
        self._keeping: asyncio.Task[None] | None = None
        self._enabled = enabled

    async def __aenter__(self) -> LedgerLocks:
        if self._enabled:
            self._keeping = asyncio.create_task(self._keeper.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._keeping is not None:
            self._keeping.cancel()
            await asyncio.gather(self._keeping, return_exceptions=True)
        if self._keeper.lease_id is not None:
            await self._bk.meta.revoke_lease(self._keeper.lease_id)

    @contextlib.asynccontextmanager
    async def hold(self, ledger_id: int) -> AsyncIterator[str | None]:
        """Take the ledger's lock for the block: yields None, or who holds it (the
        block must then leave the ledger alone)."""
        from ..meta.keys import ledger_lock

        if self._keeping is None:
            yield None
            return
        lock = ledger_lock(ledger_id)
        async with asyncio.timeout(self._bk.config.metadata_timeout_s):
            lease_id = await self._keeper.ready()
        holder = await self._bk.meta.acquire_lock(lock, self.owner, lease_id)
        if holder != self.owner:
            yield holder
            return
        try:
            yield None
        finally:
            await self._bk.meta.release_lock(lock, self.owner)
