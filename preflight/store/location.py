"""Where the results store lives: ``--db URL``, ``$PREFLIGHT_DB``, or the embedded default, a
SQLite file in the user's XDG state directory. A URL's password is never shown: every message,
log line and report names a store by ``StoreUrl.shown``, which masks it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

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
        parts = urlsplit(text)
        if not parts.path.strip("/") and "dbname=" not in parts.query:
            raise StoreUrlError(f"{mask(text)!r}: name the database (postgresql://HOST/DBNAME)")
        return StoreUrl(POSTGRES, text, mask(text))
    raise StoreUrlError(f"{mask(text)!r}: unknown store; use sqlite:///PATH or postgresql://HOST/DBNAME")


def mask(url: str) -> str:
    """The URL with any password replaced by ``***``, in the netloc and in a ``password=`` query."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return re.sub(r"(//[^:/@]*:)[^@]*@", r"\1***@", url)
    netloc = parts.netloc
    if "@" in netloc:
        cred, host = netloc.rsplit("@", 1)
        if ":" in cred:
            netloc = cred.split(":", 1)[0] + ":***@" + host
    query = re.sub(r"(?i)(^|&)(password=)[^&]*", r"\1\2***", parts.query)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def scrub(text: str, url: StoreUrl) -> str:
    """``text`` (a driver's message) with the store's password removed wherever it appears."""
    parts = urlsplit(url.target) if url.dialect == POSTGRES else None
    secrets = [s for s in ((parts.password if parts else None),
                           *re.findall(r"(?i)password=([^&]+)", parts.query if parts else "")) if s]
    for s in secrets:
        text = text.replace(s, "***")
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
