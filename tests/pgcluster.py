"""A real PostgreSQL server for the store's tests: Debian's ``postgresql`` binaries, a cluster of
its own made by ``initdb`` in a temporary directory, started by ``pg_ctl`` on a unix socket only
(no TCP port to collide with), stopped when the tests end.

PostgreSQL refuses to run as root, and CI runs as root: the cluster then belongs to the
``postgres`` user the package creates, and the commands run as that user through ``runuser``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


def _bindir() -> Path | None:
    """The newest installed PostgreSQL's bin directory (``/usr/lib/postgresql/<major>/bin``)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    pg_ctl = shutil.which("pg_ctl")
    return Path(pg_ctl).resolve().parent if pg_ctl else None


def why_not() -> str | None:
    """Why no cluster can be made here; None when one can."""
    try:
        import psycopg  # noqa: F401 - the driver the store uses
    except ImportError:
        return "psycopg is not installed (pip install 'psycopg[binary]')"
    if _bindir() is None:
        return "PostgreSQL's initdb/pg_ctl not found (apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to own the cluster"
        if shutil.which("runuser") is None:
            return "running as root without runuser"
    return None


@dataclass
class PgCluster:
    root: Path
    socket_dir: Path
    log: Path
    user: str
    opts: str = ""

    def url(self, database: str = "postgres") -> str:
        # libpq takes a unix socket directory as the host, percent-encoded in a URL.
        return f"postgresql://{self.user}@/{database}?host={self.socket_dir}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            cur = conn.execute(sql)
            return "" if cur.description is None else repr(cur.fetchall())

    def create_database(self, name: str) -> str:
        self.psql(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _as_owner(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def start(max_connections: int = 100, root: Path | None = None) -> PgCluster:
    """initdb + pg_ctl start in a fresh temporary directory; raises with the server's log on failure.
    ``root``: a directory kept between uses instead (a benchmark's big store): its cluster is made
    once, started when it is not running, and left as it is when it is."""
    bindir = _bindir()
    assert bindir is not None
    root = Path(tempfile.mkdtemp(prefix="preflight-pg-")) if root is None else root
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    data, sock, log = root / "data", root / "sock", root / "server.log"
    sock.mkdir(exist_ok=True)
    user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    if os.geteuid() == 0:
        for p in (root, sock):
            shutil.chown(p, "postgres", "postgres")
        log.touch()
        shutil.chown(log, "postgres", "postgres")
    # fsync off: a test cluster's durability is not under test, its time is.
    opts = (f"-c listen_addresses='' -c unix_socket_directories='{sock}' -c fsync=off "
            f"-c synchronous_commit=off -c full_page_writes=off -c max_connections={max_connections}")
    if (data / "PG_VERSION").exists():
        if subprocess.run(_as_owner([str(bindir / "pg_ctl"), "-D", str(data), "status"]),
                          capture_output=True, timeout=30).returncode == 0:
            return PgCluster(root, sock, log, user, opts)
    else:
        subprocess.run(_as_owner([str(bindir / "initdb"), "-D", str(data), "-U", user, "-A", "trust",
                                  "--no-sync", "-E", "UTF8", "--locale=C"]),
                       check=True, capture_output=True, timeout=120)
    proc = subprocess.run(_as_owner([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", opts,
                                     "-w", "-t", "60", "start"]), capture_output=True, text=True, timeout=90)
    if proc.returncode:
        raise RuntimeError(f"pg_ctl start failed: {proc.stderr}\n{log.read_text(errors='replace')}")
    return PgCluster(root, sock, log, user, opts)


def halt(cluster: PgCluster) -> None:
    """The server gone at once, as a crash or a lost database host: its data stays for ``resume``."""
    subprocess.run(_as_owner([str(_bindir() / "pg_ctl"), "-D", str(cluster.root / "data"), "-m", "immediate",
                              "-w", "stop"]), capture_output=True, timeout=60, check=True)


def resume(cluster: PgCluster) -> None:
    proc = subprocess.run(_as_owner([str(_bindir() / "pg_ctl"), "-D", str(cluster.root / "data"), "-l",
                                     str(cluster.log), "-o", cluster.opts, "-w", "-t", "60", "start"]),
                          capture_output=True, text=True, timeout=90)
    if proc.returncode:
        raise RuntimeError(f"pg_ctl start failed: {proc.stderr}\n{cluster.log.read_text(errors='replace')}")


def stop(cluster: PgCluster) -> None:
    bindir = _bindir()
    subprocess.run(_as_owner([str(bindir / "pg_ctl"), "-D", str(cluster.root / "data"), "-m", "immediate",
                              "-w", "stop"]), capture_output=True, timeout=60)
    shutil.rmtree(cluster.root, ignore_errors=True)
