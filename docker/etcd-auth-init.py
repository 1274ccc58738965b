#!/usr/bin/env python3
"""One shot: turn on etcd's own authentication for an asyncbk cluster (the compose
stack's ``etcd-auth-init`` service; docs/docker.md).

With authentication off, it makes

* the user ``root`` with the role ``root`` (etcd wants both before authentication
  can be turned on), with the password of ``ASYNCBK_ETCD_ROOT_PASSWORD_FILE``;
* the user of ``ASYNCBK_ETCD_USER`` (default ``asyncbk``) with the password of
  ``ASYNCBK_ETCD_PASSWORD_FILE`` and a role of the same name that may read and
  write the keys under the root prefix of ``ASYNCBK_METADATA_URI`` only;

then turns authentication on and checks that the user can log in and read its
prefix. A user or role that exists already (a run that stopped half-way) is
kept; with authentication still off, a user's password is set to its file's.

With authentication on already (a later ``up``), it changes nothing: it checks that
the user's password file still logs in, and says so if root's does not.

``--set-password`` (authentication on) logs in as root and sets the user's password
to its file's: the rotation of docs/docker.md. etcd drops the user's tokens at once,
so the running bookies, which hold the old password, cannot log in to etcd again
until they are restarted with the new file.

Settings, from the environment (the asyncbk image's ``ASYNCBK_*`` names):

* ``ASYNCBK_METADATA_URI``: ``etcds://host:port[,...]/<root>``, the members to ask
  (the first that answers) and the prefix the user may use. It must have a root.
* ``ASYNCBK_ETCD_CA``, ``ASYNCBK_ETCD_CERT``, ``ASYNCBK_ETCD_KEY``, else
  ``ASYNCBK_TLS_CA``, ``ASYNCBK_TLS_CERT``, ``ASYNCBK_TLS_KEY``: the CA of etcd's
  certificate and the client certificate etcd's ``--client-cert-auth`` asks for (as
  asyncbk itself picks them). etcd's host name is checked.
* ``ASYNCBK_ETCD_USER``, ``ASYNCBK_ETCD_PASSWORD_FILE``,
  ``ASYNCBK_ETCD_ROOT_PASSWORD_FILE``: passwords come from files (their first line)
  only, never from the environment or a command line; none is ever printed.
* ``ASYNCBK_ETCD_INIT_WAIT_S``: how long to wait for etcd to answer (default 60).

Exit status: 0 done (or nothing to do), 1 etcd refused or could not be reached,
2 a setting is wrong.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

DEFAULT_USER = "asyncbk"
WAIT_S_DEFAULT = 60.0
TIMEOUT_S = 10.0
AUTH_REQUIRED = ("user name is empty", "invalid auth token", "permission denied")
"""What etcd says to a request without a user when authentication is on."""


class InitError(Exception):
    """etcd refused, or could not be reached."""


class SettingError(Exception):
    """A setting is missing or wrong."""


class EtcdError(InitError):
    """etcd answered with an error."""

    def __init__(self, path: str, status: int, message: str) -> None:
        super().__init__(f"etcd {path}: HTTP {status}: {message}")
        self.message = message


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def read_secret(path: str, what: str) -> str:
    """The first line of ``path`` (a password file)."""
    if not path:
        raise SettingError(f"{what}: no file given")
    try:
        with open(path, encoding="utf-8") as fh:
            line = fh.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingError(f"{what} {path!r} unreadable: {type(exc).__name__}") from None
    if not line:
        raise SettingError(f"{what} {path!r} is empty (the password goes on its first line)")
    return line


class Settings:
    """What the environment says (see the module docstring)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        from asyncbk.errors import ConfigError
        from asyncbk.meta import keys
        from asyncbk.meta.uri import parse_metadata_uri

        def get(name: str) -> str:
            return environ.get(name, "").strip()

        uri = get("ASYNCBK_METADATA_URI")
        if not uri:
            raise SettingError("ASYNCBK_METADATA_URI is not set")
        try:
            parsed = parse_metadata_uri(uri)
        except ConfigError as exc:
            raise SettingError(str(exc)) from None
        if parsed.scheme != "etcd" or not parsed.tls:
            raise SettingError(f"ASYNCBK_METADATA_URI {uri!r}: expected etcds://... (TLS)")
        if not parsed.root:
            raise SettingError(f"ASYNCBK_METADATA_URI {uri!r} has no root prefix: give one "
                               "(etcds://.../asyncbk), which is all the user may use")
        self.endpoints = parsed.endpoints
        prefix = parsed.root + "/"
        self.prefix = prefix.encode()
        # prefix_end hands back the incremented UTF-8 bytes as latin-1 text
        self.prefix_end = keys.prefix_end(prefix).encode("latin-1")
        own = [get(f"ASYNCBK_ETCD_{n}") for n in ("CA", "CERT", "KEY")]
        self.ca, self.cert, self.key = (own if any(own) else
                                        [get(f"ASYNCBK_TLS_{n}") for n in ("CA", "CERT", "KEY")])
        if bool(self.cert) != bool(self.key):
            raise SettingError("a client certificate needs both its file and its key "
                               "(ASYNCBK_ETCD_CERT/KEY or ASYNCBK_TLS_CERT/KEY)")
        self.user = get("ASYNCBK_ETCD_USER") or DEFAULT_USER
        if self.user == "root":
            raise SettingError("ASYNCBK_ETCD_USER must not be root (asyncbk needs no more "
                               "than its prefix)")
        self.password_file = get("ASYNCBK_ETCD_PASSWORD_FILE")
        self.root_password_file = get("ASYNCBK_ETCD_ROOT_PASSWORD_FILE")
        if not self.password_file or not self.root_password_file:
            raise SettingError("ASYNCBK_ETCD_PASSWORD_FILE and ASYNCBK_ETCD_ROOT_PASSWORD_FILE "
                               "must name the password files")
        wait = get("ASYNCBK_ETCD_INIT_WAIT_S") or str(WAIT_S_DEFAULT)
        try:
            self.wait_s = float(wait)
        except ValueError:
            raise SettingError(f"ASYNCBK_ETCD_INIT_WAIT_S must be seconds, not {wait!r}") \
                from None

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca or None)  # host names checked
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx


class Etcd:
    """etcd's JSON gateway (``/v3/...``) on one member, over TLS."""

    def __init__(self, base: str, ctx: ssl.SSLContext) -> None:
        self.base = base
        self.ctx = ctx
        self.token = ""

    def call(self, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body or {}).encode()
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = self.token
        request = urllib.request.Request(f"{self.base}/v3/{path}", data=data, headers=headers,
                                         method="POST")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=self.ctx) as resp:
                answer = json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                answer = json.loads(exc.read() or b"{}")
            except ValueError:
                answer = {}
            message = answer.get("message") or answer.get("error") or exc.reason
            raise EtcdError(path, exc.code, str(message)) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise InitError(f"{self.base}: {getattr(exc, 'reason', exc)}") from None
        if isinstance(answer, dict) and answer.get("error"):
            raise EtcdError(path, 200, str(answer.get("message") or answer["error"]))
        return answer if isinstance(answer, dict) else {}

    def authenticate(self, name: str, password: str) -> str:
        return str(self.call("auth/authenticate", {"name": name, "password": password})
                   .get("token", ""))


def connect(settings: Settings, log: Any) -> tuple[Etcd, bool]:
    """The first member that answers, and whether authentication is on; waits up to
    ``settings.wait_s`` for one."""
    try:
        ctx = settings.ssl_context()
    except (OSError, ssl.SSLError) as exc:
        raise SettingError(f"TLS material unusable: {exc}") from None
    deadline = time.monotonic() + settings.wait_s
    while True:
        errors = []
        for host, port in settings.endpoints:
            etcd = Etcd(f"https://{host}:{port}", ctx)
            try:
                return etcd, bool(etcd.call("auth/status").get("enabled"))
            except EtcdError as exc:
                # etcd 3.5 answers auth/status only to a user once authentication is on
                if any(m in exc.message for m in AUTH_REQUIRED):
                    return etcd, True
                raise
            except InitError as exc:
                errors.append(str(exc))
        if time.monotonic() >= deadline:
            raise InitError("no etcd member answered: " + "; ".join(errors))
        log(f"waiting for etcd ({errors[-1]})")
        time.sleep(2.0)


def _exists(exc: EtcdError) -> bool:
    return "already exists" in exc.message or "already granted" in exc.message


def _ensure_user(etcd: Etcd, name: str, password: str, log: Any) -> None:
    try:
        etcd.call("auth/user/add", {"name": name, "password": password})
        log(f"user {name} made")
    except EtcdError as exc:
        if not _exists(exc):
            raise
        etcd.call("auth/user/changepw", {"name": name, "password": password})
        log(f"user {name} was there; its password set to its file's")


def _ensure_role(etcd: Etcd, name: str, log: Any) -> None:
    try:
        etcd.call("auth/role/add", {"name": name})
        log(f"role {name} made")
    except EtcdError as exc:
        if not _exists(exc):
            raise


def _check_user(etcd: Etcd, settings: Settings, password: str) -> None:
    """The user logs in and may read its prefix."""
    user = Etcd(etcd.base, etcd.ctx)
    try:
        user.token = user.authenticate(settings.user, password)
    except EtcdError as exc:
        raise InitError(f"etcd user {settings.user!r} cannot log in with the password of "
                        f"{settings.password_file} ({exc.message}); if the file was made "
                        "anew, see 'etcd users' in docs/docker.md") from None
    user.call("kv/range", {"key": _b64(settings.prefix),
                           "range_end": _b64(settings.prefix_end), "limit": 1})


def set_password(etcd: Etcd, settings: Settings, password: str, root_password: str,
                 log: Any) -> None:
    """Log in as root and set the user's password (authentication on)."""
    try:
        etcd.token = etcd.authenticate("root", root_password)
    except EtcdError as exc:
        raise InitError(f"root cannot log in with the password of "
                        f"{settings.root_password_file} ({exc.message})") from None
    etcd.call("auth/user/changepw", {"name": settings.user, "password": password})
    _check_user(etcd, settings, password)
    log(f"user {settings.user}'s password set to the one of {settings.password_file}; "
        "restart the processes that log in as it")


def run(settings: Settings, log: Any, *, rotate: bool = False) -> None:
    password = read_secret(settings.password_file, "ASYNCBK_ETCD_PASSWORD_FILE")
    root_password = read_secret(settings.root_password_file,
                                "ASYNCBK_ETCD_ROOT_PASSWORD_FILE")
    etcd, enabled = connect(settings, log)
    prefix = settings.prefix.decode()
    if enabled and rotate:
        set_password(etcd, settings, password, root_password, log)
        return
    if enabled:
        _check_user(etcd, settings, password)
        try:
            Etcd(etcd.base, etcd.ctx).authenticate("root", root_password)
        except EtcdError as exc:
            log(f"warning: root cannot log in with the password of "
                f"{settings.root_password_file} ({exc.message})")
        log(f"etcd authentication is on; user {settings.user} logs in and may use {prefix}")
        return
    _ensure_user(etcd, "root", root_password, log)
    _ensure_role(etcd, "root", log)
    etcd.call("auth/user/grant", {"user": "root", "role": "root"})
    _ensure_user(etcd, settings.user, password, log)
    _ensure_role(etcd, settings.user, log)
    etcd.call("auth/role/grant", {"name": settings.user, "perm": {
        "permType": "READWRITE", "key": _b64(settings.prefix),
        "range_end": _b64(settings.prefix_end)}})
    etcd.call("auth/user/grant", {"user": settings.user, "role": settings.user})
    etcd.call("auth/enable")
    _check_user(etcd, settings, password)
    log(f"etcd authentication turned on; user {settings.user} may read and write {prefix}")


def main() -> None:
    def log(line: str) -> None:
        sys.stdout.write(f"etcd-auth-init: {line}\n")
        sys.stdout.flush()

    args = sys.argv[1:]
    if args not in ([], ["--set-password"]):
        sys.stderr.write("usage: asyncbk-etcd-auth-init [--set-password]\n")
        sys.exit(2)
    try:
        run(Settings(os.environ), log, rotate=bool(args))
    except SettingError as exc:
        sys.stderr.write(f"etcd-auth-init: error: {exc}\n")
        sys.exit(2)
    except InitError as exc:
        sys.stderr.write(f"etcd-auth-init: error: {exc}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
