"""A soak run's plan: what ``preflight soak`` was asked to do, kept in run.json for ``--attach``.

``SoakPlan`` is everything needed to start, and later re-attach to, one run: the hosts (or this
machine), the engine and its options as agent arguments, the SSH options, where the agents keep
their files on the nodes. ``plan_from_args`` makes one from the command line (``add_parser``
declares its options) and refuses bad input with ``SoakUsageError`` before anything runs;
``write_plan`` / ``load_plan`` keep it in ``reports/<run-id>/soak/run.json``
(``preflight-soak-run/1``), so a controller that died, or a Ctrl-C, loses nothing but the watch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from preflight.collect.inventory import load_hosts_file, parse_host_list
from preflight.collect.ssh import SshOptions
from preflight.contracts import SOAK_RUN_FORMAT
from preflight.knowledge.datafile import positive
from preflight.model import Host

# The node-side files (preflight/node): the agent and its siblings, and the built-in model
# configs a vllm plan may name (shipped with the agent).
NODE_SOURCES = Path(__file__).resolve().parent.parent / "node"
MODELS_DIR = NODE_SOURCES / "models"
NODE_DIR = "~/.cache/preflight/soak"
ENGINES = ("burn", "vllm", "endpoint", "none")
POLL_S = 2.0


class SoakUsageError(ValueError):
    """Bad options or a run that cannot be attached; the CLI exits 2 with the message."""


@dataclass(frozen=True)
class SoakPlan:
    """Everything needed to start, and later re-attach to, one soak run.

    ``hosts`` empty means this machine (``local_name`` names it in the files). ``python`` is the
    interpreter on the nodes (default ``python3``; locally, this one). ``agent_args`` are passed
    to every agent as they are (e.g. ``--bench 30``, ``--model tiny-llama-ci``); ``builtin_model``
    names the config in ``models/`` that goes with the agent, if the model is one of those."""

    run_id: str
    out: Path
    engine: str
    seconds: float
    interval_s: float
    hosts: tuple[Host, ...] = ()
    local_name: str = "localhost"
    ssh: SshOptions = field(default_factory=SshOptions)
    python: str | None = None
    node_dir: str = NODE_DIR
    agent_args: tuple[str, ...] = ()
    builtin_model: str | None = None
    poll_s: float = POLL_S
    created: float = field(default_factory=time.time)

    @property
    def run_dir(self) -> Path:
        return self.out / self.run_id

    @property
    def node_python(self) -> str:
        """The interpreter of the node-side commands: ``python`` when given; else python3 on
        the nodes, and this interpreter when the soak runs on this machine."""
        return self.python or (sys.executable if not self.hosts else "python3")

    def to_json(self) -> dict:
        ssh = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.ssh).items()}
        return {"format": SOAK_RUN_FORMAT, "run_id": self.run_id, "engine": self.engine, "seconds": self.seconds,
                "interval_s": self.interval_s, "hosts": [asdict(h) for h in self.hosts],
                "local_name": self.local_name, "ssh": ssh, "python": self.python, "node_dir": self.node_dir,
                "agent_args": list(self.agent_args), "builtin_model": self.builtin_model, "poll_s": self.poll_s,
                "created": self.created}

    @classmethod
    def from_json(cls, doc: dict, out: Path) -> SoakPlan:
        ssh = {k: (Path(v) if k in ("identity", "ssh_config", "known_hosts") and v else v)
               for k, v in doc["ssh"].items()}
        return cls(run_id=doc["run_id"], out=out, engine=doc["engine"], seconds=doc["seconds"],
                   interval_s=doc["interval_s"], hosts=tuple(Host(**h) for h in doc["hosts"]),
                   local_name=doc["local_name"], ssh=SshOptions(**ssh), python=doc["python"],
                   node_dir=doc["node_dir"], agent_args=tuple(doc["agent_args"]),
                   builtin_model=doc.get("builtin_model"), poll_s=doc["poll_s"], created=doc["created"])


def run_json_path(out: Path, run_id: str) -> Path:
    return out / run_id / "soak" / "run.json"


def write_plan(plan: SoakPlan) -> Path:
    path = run_json_path(plan.out, plan.run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan.to_json(), indent=1) + "\n")
    return path


def load_plan(out: Path, run_id: str) -> SoakPlan:
    path = run_json_path(out, run_id)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise SoakUsageError(f"--attach: no soak run {run_id!r} here ({path} does not exist)") from None
    except ValueError as exc:
        raise SoakUsageError(f"--attach: {path}: not JSON ({exc})") from None
    if doc.get("format") != SOAK_RUN_FORMAT:
        raise SoakUsageError(f"--attach: {path}: format is {doc.get('format')!r}, expected {SOAK_RUN_FORMAT!r}")
    return SoakPlan.from_json(doc, out)


def builtin_models() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


# --- The command line -------------------------------------------------------------------------


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("soak", help="full-load burn-in with NVML telemetry on every node (detached agents)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--hosts", metavar="FILE", type=Path, help="hosts file: [user@]host[:port] per line")
    where.add_argument("-H", dest="host_list", metavar="HOSTS", help="hosts inline: a,b,gpu[01-04]")
    where.add_argument("--local", action="store_true", help="soak this machine (the default with no hosts)")
    where.add_argument("--attach", metavar="RUN_ID", help="re-attach to a run: watch it, collect and analyse")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--hours", type=_positive, help="run length in hours (default 1)")
    length.add_argument("--minutes", type=_positive, help="run length in minutes")
    p.add_argument("--engine", choices=ENGINES, help="load: burn (PyTorch GEMM + HBM copy; the default), vllm "
                   "(serve --model with dummy weights and load it), endpoint (load --endpoint URL), or none "
                   "(telemetry only, you load the GPUs)")
    p.add_argument("--interval", type=_positive, default=1.0, help="seconds between NVML samples (default 1, min 0.1)")
    p.add_argument("--bench", type=_positive, metavar="S",
                   help="burn: then run a plain torch.matmul loop for S s per GPU")
    p.add_argument("--python", help="Python on the nodes, with pynvml (and torch for burn) (default: python3)")
    serve = p.add_argument_group("vllm and endpoint engines (a vllm soak's length counts from the moment the "
                                 "server answers; its start-up comes on top)")
    serve.add_argument("--model", help=f"vllm: a built-in model config ({', '.join(builtin_models())}, shipped "
                       "with the agent), or an HF config directory, model path or hub id as the nodes see it")
    serve.add_argument("--vllm-python", metavar="PYTHON", help="vllm: the Python on the nodes that has vLLM "
                       "(default python3)")
    serve.add_argument("--vllm-arg", action="append", default=[], metavar="ARGS",
                       help="vllm: more server flags, split like a shell line; repeatable, e.g. "
                            "--vllm-arg=--enforce-eager --vllm-arg='--kv-cache-dtype fp8'")
    serve.add_argument("--skip-tokenizer-init", dest="skip_tokenizer_init", action="store_true", default=None,
                       help="vllm: start the server without a tokenizer (the agent's default)")
    serve.add_argument("--no-skip-tokenizer-init", dest="skip_tokenizer_init", action="store_false",
                       help="vllm: let the server load the model's tokenizer")
    serve.add_argument("--ready-timeout", type=_positive, metavar="S",
                       help="vllm: longest server start-up (the agent's default: 1200 s)")
    serve.add_argument("--endpoint", metavar="URL", help="load this running OpenAI-compatible server "
                       "(implies --engine endpoint)")
    serve.add_argument("--concurrency", type=positive(int), help="vllm/endpoint: requests in flight (default 256)")
    serve.add_argument("--max-tokens", type=positive(int), help="vllm/endpoint: output tokens per request "
                       "(default 256)")
    p.add_argument("--node-dir", default=NODE_DIR,
                   help=f"where agents keep their files on the nodes (default {NODE_DIR})")
    p.add_argument("--poll", type=_positive, default=POLL_S,
                   help=f"seconds between polls of the nodes (default {POLL_S:g})")
    p.add_argument("--run-id", help="name of the run directory (default: timestamp)")
    p.add_argument("--out", metavar="DIR", type=Path, default=Path("reports"), help="where run directories go")
    p.add_argument("--user", help="SSH user")
    p.add_argument("--port", type=int, help="SSH port")
    p.add_argument("--identity", "-i", type=Path, metavar="KEY", help="SSH private key")
    p.add_argument("--ssh-config", type=Path, metavar="FILE", help="OpenSSH client config")
    p.add_argument("--known-hosts", type=Path, metavar="FILE", help="extra known_hosts file")
    p.add_argument("--accept-new-host-keys", action="store_true", help="accept host keys not in known_hosts")
    p.add_argument("--connect-timeout", type=_positive, default=10.0, help="seconds to connect (default 10)")
    p.add_argument("-q", "--quiet", action="store_true", help="no live view")
    return p


_positive = positive(float)


# The command line's options for the serving engines (argparse dest -> the engines they apply to).
SERVE_OPTIONS = {"model": ("vllm",), "vllm_python": ("vllm",), "vllm_arg": ("vllm",), "skip_tokenizer_init": ("vllm",),
                 "ready_timeout": ("vllm",), "endpoint": ("endpoint",), "concurrency": ("vllm", "endpoint"),
                 "max_tokens": ("vllm", "endpoint")}


def serving_args(args, engine: str) -> tuple[str, ...]:
    """The agent's flags for the vllm and endpoint engines, from the command line's; each value
    is one argv item (``--vllm-arg=VALUE``, so a value starting with ``-`` stays a value)."""
    given = [k for k in SERVE_OPTIONS if getattr(args, k) not in (None, [])]
    stray = [k for k in given if engine not in SERVE_OPTIONS[k]]
    if stray:
        raise SoakUsageError(f"--{stray[0].replace('_', '-')} does not apply to --engine {engine}")
    if engine == "vllm" and not args.model:
        raise SoakUsageError(f"--engine vllm needs --model (built-in: {', '.join(builtin_models())})")
    out: list[str] = []
    for key in given:
        value = getattr(args, key)
        if key == "vllm_arg":
            out += [f"--vllm-arg={v}" for v in value]
        elif key == "skip_tokenizer_init":
            out.append("--skip-tokenizer-init" if value else "--no-skip-tokenizer-init")
        else:
            out.append(f"--{key.replace('_', '-')}={value}")
    return tuple(out)


def plan_from_args(args, local_name: str, run_id: str) -> SoakPlan:
    engine = args.engine or ("endpoint" if args.endpoint else "burn")
    if engine == "endpoint" and not args.endpoint:
        raise SoakUsageError("--engine endpoint needs --endpoint URL")
    serve_args = serving_args(args, engine)
    if args.interval < 0.1:
        raise SoakUsageError("--interval: at most 10 samples a second (>= 0.1 s)")
    if "/" in run_id or run_id in (".", ".."):
        raise SoakUsageError(f"--run-id: {run_id!r} must be a plain directory name")
    if (args.out / run_id).exists():
        raise SoakUsageError(f"--run-id: {args.out / run_id} already exists; choose another id")
    for path, opt in ((args.identity, "--identity"), (args.ssh_config, "--ssh-config"),
                      (args.known_hosts, "--known-hosts")):
        if path and not path.is_file():
            raise SoakUsageError(f"{opt}: {path}: no such file")
    if args.hosts:
        hosts = load_hosts_file(args.hosts)
    elif args.host_list:
        hosts = parse_host_list(args.host_list)
    else:
        hosts = []
    seconds = args.minutes * 60 if args.minutes else (args.hours or 1.0) * 3600
    agent_args = (("--bench", repr(args.bench)) if args.bench else ()) + serve_args
    builtin = args.model if engine == "vllm" and args.model in builtin_models() else None
    return SoakPlan(run_id=run_id, out=args.out, engine=engine, seconds=seconds, interval_s=args.interval,
                    hosts=tuple(hosts), local_name=local_name, ssh=ssh_options(args), python=args.python,
                    node_dir=args.node_dir, agent_args=agent_args, builtin_model=builtin, poll_s=args.poll)


def ssh_options(args) -> SshOptions:
    return SshOptions(args.user, args.port, args.identity, args.ssh_config, args.known_hosts,
                      args.accept_new_host_keys, args.connect_timeout)

