"""Where the results store lives: ``--db URL``, ``$PREFLIGHT_DB``, or the embedded default, a
SQLite file in the user's XDG state directory. A URL's password is never shown: every message,
log line and report names a store by ``StoreUrl.shown``, which masks it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

ENV = "PREFLIGHT_DB"
DEFAULT_NAME = "history.sqlite"
SQLITE, POSTGRES = "sqlite", "postgresql"


class StoreUrlError(ValueError):
    """A store URL that names no store preflight can open."""


@dataclass(frozen=True)
class StoreUrl:
    dialect: str  # "sqlite" | "postgresql"
    target: str  # the file for SQLite; the libpq URL (password included) for PostgreSQL
    shown: str  # what messages print: the password masked

    @property
    def path(self) -> Path:
        return Path(self.target)


def state_dir(env: dict | None = None) -> Path:
    """``$XDG_STATE_HOME/preflight``, else ``~/.local/state/preflight`` (the XDG base-directory
    specification's place for state that outlives a run but is not worth backing up as data)."""
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path(env.get("HOME") or Path.home()) / ".local" / "state"
    return root / "preflight"


def default_url(env: dict | None = None) -> str:
    return f"sqlite:///{state_dir(env) / DEFAULT_NAME}"


def parse(url: str) -> StoreUrl:
    """``sqlite:///ABSOLUTE/PATH``, ``sqlite:///relative/path`` (SQLAlchemy's spelling: three
    slashes, then the path), or ``postgresql://[user[:password]@][host][:port]/dbname[?params]``
    (libpq's own URL, passed to it unchanged; ``postgres://`` too)."""
    text = url.strip()
    if not text:
        raise StoreUrlError("the store URL is empty")
    scheme = text.split(":", 1)[0].lower() if ":" in text else ""
    if scheme == "sqlite":
        if not text.lower().startswith("sqlite:///"):
            raise StoreUrlError(f"{text!r}: a SQLite URL is sqlite:///PATH (three slashes, then the file)")
        path = text[len("sqlite:///"):]
        if not path or path.endswith("/"):
            raise StoreUrlError(f"{text!r}: no file named after sqlite:///")
        return StoreUrl(SQLITE, path, text)
    if scheme in ("postgresql", "postgres") or scheme.startswith("postgresql+"):
        if scheme.startswith("postgresql+"):  # SQLAlchemy's driver suffix, harmless here
            text = "postgresql" + text[len(scheme):]
        try:
            parts = urlsplit(text)
        except ValueError as exc:  # a broken IPv6 host ("[::1"): urllib refuses it
            raise StoreUrlError(f"{mask(text)!r}: {exc}") from None
        if not parts.path.strip("/") and "dbname=" not in parts.query:
            raise StoreUrlError(f"{mask(text)!r}: name the database (postgresql://HOST/DBNAME)")
        return StoreUrl(POSTGRES, text, mask(text))
    raise StoreUrlError(f"{mask(text)!r}: unknown store; use sqlite:///PATH or postgresql://HOST/DBNAME")


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_QUERY_PASSWORD = re.compile(r"(?i)(password=)([^&\s]*)")


def _password_span(url: str) -> tuple[int, int] | None:
    """Where the password of ``scheme://user:password@host...`` lies in ``url``, found without
    trusting the URL to be well formed. PostgreSQL's documentation asks for ``@ / ? # :`` in a
    password to be percent-encoded (libpq, "Connection URIs"), but one typed unencoded must
    stay hidden too, and urllib then reads ``#`` or ``?`` as the start of a fragment or query
    and finds no password at all. So the credentials end at the last ``@`` before the first
    ``/`` that follows an ``@``: that covers ``@``, ``/``, ``?`` and ``#`` inside a password,
    at worst hiding a host that a query's own ``@`` made look like one."""
    m = _SCHEME.match(url)
    if not m or m.group().lower().startswith("sqlite"):
        return None  # a SQLite URL carries a path, never credentials
    rest = m.end()
    first_at = url.find("@", rest)
    if first_at < 0:
        return None
    slash = url.find("/", first_at)
    last_at = url.rfind("@", rest, slash if slash >= 0 else len(url))
    colon = url.find(":", rest, last_at)
    return (colon + 1, last_at) if colon >= 0 else None


def mask(url: str) -> str:
    """The URL with any password replaced by ``***``, in the credentials and in a
    ``password=`` query parameter, however the URL is spelled (broken ones included)."""
    span = _password_span(url)
    if span:
        url = url[:span[0]] + "***" + url[span[1]:]
    return _QUERY_PASSWORD.sub(r"\1***", url)


def mask_in(text: str) -> str:
    """``text`` (a word of a command line, say ``--db=postgresql://u:pw@h/db`` or a
    ``--retest-arg`` holding one) with every URL in it masked: each URL runs from its scheme to
    the next one or the end. Also every ``password=VALUE``, the libpq keyword form included."""
    starts = [m.start() for m in _SCHEME.finditer(text)]
    if not starts:
        return _QUERY_PASSWORD.sub(r"\1***", text)
    pieces = [text[:starts[0]]] + [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)], strict=True)]
    return _QUERY_PASSWORD.sub(r"\1***", pieces[0]) + "".join(mask(p) for p in pieces[1:])


def secrets_of(url: StoreUrl) -> list[str]:
    """The store URL's passwords as typed: the credentials' and any ``password=`` value."""
    if url.dialect != POSTGRES:
        return []
    span = _password_span(url.target)
    found = [url.target[span[0]:span[1]]] if span else []
    found += [m.group(2) for m in _QUERY_PASSWORD.finditer(url.target)]
    return [s for s in found if s]


def scrub(text: str, url: StoreUrl) -> str:
    """``text`` (a driver's message) with the store's password removed wherever it appears,
    as typed and as a driver decodes it."""
    for s in secrets_of(url):
        for form in dict.fromkeys((s, unquote(s))):
            text = text.replace(form, "***")
    # A PostgreSQL URL a driver quotes whole is shown masked; a SQLite path is no secret.
    return text.replace(url.target, url.shown) if url.dialect == POSTGRES and url.target != url.shown else text


def chosen(given: str | None, no_db: bool = False, env: dict | None = None) -> StoreUrl | None:
    """The store a command records into: ``--no-db`` none; else ``--db``; else ``$PREFLIGHT_DB``
    (empty means none, so a site can turn the default off); else the default file."""
    if no_db:
        return None
    env = os.environ if env is None else env
    if given is not None:
        return parse(given)
    if ENV in env:
        return parse(env[ENV]) if env[ENV].strip() else None
    return parse(default_url(env))
