"""A hung sshd (accepts the TCP connection, never sends its banner): the host's reason says
"no SSH banner", within --connect-timeout, and paramiko prints no traceback on stderr. Run in a
child process, as the CLI runs, so that stderr is what a user would see (pytest's own log
capture would hide paramiko's log here)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import sys, time
from pathlib import Path
from preflight.collect.ssh import SshNode, SshOptions
from preflight.model import Host
node = SshNode(Host("127.0.0.1", port=int(sys.argv[1])), SshOptions(known_hosts=Path(sys.argv[2]), connect_timeout_s=1.0))
start = time.monotonic()
print(node.connect())
print(round(time.monotonic() - start, 1))
time.sleep(0.3)  # paramiko's transport thread logs as it ends
"""


def test_a_port_that_never_sends_a_banner(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    held = []
    threading.Thread(target=lambda: held.append(server.accept()), daemon=True).start()
    known = tmp_path / "known_hosts"
    known.write_text("")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(server.getsockname()[1]), str(known)],
                          capture_output=True, text=True, timeout=60, env=env)
    server.close()
    why, seconds = done.stdout.strip().splitlines()[-2:]
    assert why.startswith("no SSH banner: the port accepted the connection but no SSH server answered")
    assert float(seconds) < 5
    assert "Traceback" not in done.stderr and "paramiko" not in done.stderr, done.stderr
