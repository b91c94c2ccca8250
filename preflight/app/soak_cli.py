"""``preflight soak``'s command line: its options (the shared target, SSH and output groups of
``preflight.app.options`` plus the soak's own), the ``SoakPlan`` they make, and the command
itself: start, follow, merge and judge (``preflight.soak.controller``), with Ctrl-C leaving the
agents running for ``--attach``.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from preflight.app import extras, options, store_cli, targets
from preflight.app import load_options as load
from preflight.app.errors import INPUT_ERRORS, UsageError
from preflight.collect.local import local_host_name
from preflight.contracts import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from preflight.evidence.bundle import new_run_id
from preflight.knowledge.datafile import LONGEST_S, fraction, positive
from preflight.parse.slurm import time_limit_s
from preflight.report import consoles
from preflight.soak.plan import (
    ENGINES,
    NODE_DIR,
    POLL_S,
    SlurmSoak,
    SoakPlan,
    builtin_models,
    load_plan,
)
from preflight.soak.slo_spec import SloError, parse_slos

# Under Slurm every poll of a node is a job step slurmctld creates: polled less often.
SLURM_POLL_S = 10.0


def add_slo_options(p: argparse.ArgumentParser) -> None:
    """``--slo`` and ``--slo-budget``, for ``soak`` and for ``analyze SOAK_DIR``."""
    p.add_argument("--slo", action="append", default=[], metavar="KEY=VALUE",
                   help="a serving SLO judged on every window (repeatable): ttft_p50|ttft_p90|ttft_p99|tpot_p50|"
                        "tpot_p99=TIME (800ms, 1.5s) or error_rate=FRACTION (0.1%%, 0.001)")
    p.add_argument("--slo-budget", type=fraction("the windows"), default=0.05, metavar="F",
                   help="share of the windows an SLO may be broken in before the run fails (default 0.05)")


def slos_of(args) -> tuple:
    """The parsed ``--slo`` options; a bad one is a usage error (exit 2) naming it."""
    try:
        return parse_slos(getattr(args, "slo", None))
    except SloError as exc:
        raise UsageError(str(exc)) from None



def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("soak", help="full-load burn-in with NVML telemetry on every node (detached agents)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=options.examples(
                           "preflight soak --hours 1 --hosts hosts.txt",
                           "preflight soak --slurm -w gpu[001-064] --hours 1 --sbatch-arg=--qos=burnin",
                           "preflight soak --attach <run-id>",
                           "preflight soak --engine vllm --model llama-3-70b-dense --sweep 32,64,128,256 "
                           "--step-minutes 10 --slo ttft_p99=2s"))
    where = options.add_targets(p)
    where.add_argument("--attach", metavar="RUN_ID", help="re-attach to a run: watch it, collect and analyse")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--hours", type=positive(float, LONGEST_S / 3600), help="run length in hours (default 1)")
    length.add_argument("--minutes", type=positive(float, LONGEST_S / 60), help="run length in minutes")
    p.add_argument("--engine", choices=ENGINES, help="load: burn (PyTorch GEMM + HBM copy; the default), vllm "
                   "(serve --model with dummy weights and load it), endpoint (load --endpoint URL), or none "
                   "(telemetry only, you load the GPUs)")
    p.add_argument("--interval", type=_positive, default=1.0, help="seconds between NVML samples (default 1, min 0.1)")
    p.add_argument("--ib-interval", type=_ib_interval, metavar="S",
                   help="seconds between readings of the nodes' RDMA error counters, besides one before and one "
                        "after the load (default 300; 0: no readings)")
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
    load.add_options(serve)
    p.add_argument("--node-dir", default=NODE_DIR,
                   help=f"where agents keep their files on the nodes (default {NODE_DIR})")
    p.add_argument("--poll", type=_positive, default=None,
                   help=f"seconds between polls of the nodes (default {POLL_S:g}; {SLURM_POLL_S:g} with --slurm)")
    add_slo_options(serve)
    options.add_output(p)
    options.add_ssh(p)
    options.add_slurm(p, "soak --slurm: the agents run as srun tasks inside one allocation (nothing installed "
                         "on the nodes but python3 with pynvml, and torch for burn); no SSH",
                      "default: the soak's length plus its start-up and collection, in minutes; a shorter "
                      "limit is refused")
    return p


_positive = positive(float, LONGEST_S)


def _ib_interval(text: str) -> float:
    # 0 turns the readings off; anything else is a length like every other.
    return 0.0 if text.strip() in ("0", "0.0") else _positive(text)


# The command line's options for the serving engines (argparse dest -> the engines they apply to).
SERVE_OPTIONS = {"model": ("vllm",), "vllm_python": ("vllm",), "vllm_arg": ("vllm",), "skip_tokenizer_init": ("vllm",),
                 "ready_timeout": ("vllm",), "endpoint": ("endpoint",), "concurrency": ("vllm", "endpoint"),
                 "max_tokens": ("vllm", "endpoint"), **{k: ("vllm", "endpoint") for k in load.OPTIONS}}


def serving_args(args, engine: str) -> tuple[str, ...]:
    """The agent's flags for the vllm and endpoint engines, from the command line's; each value
    is one argv item (``--vllm-arg=VALUE``, so a value starting with ``-`` stays a value)."""
    given = [k for k in SERVE_OPTIONS if getattr(args, k) not in (None, [])]
    stray = [k for k in given if engine not in SERVE_OPTIONS[k]]
    if stray:
        raise UsageError(f"--{stray[0].replace('_', '-')} does not apply to --engine {engine}")
    if engine == "vllm" and not args.model:
        raise UsageError(f"--engine vllm needs --model (built-in: {', '.join(builtin_models())})")
    out: list[str] = []
    for key in given:
        value = getattr(args, key)
        if key == "vllm_arg":
            out += [f"--vllm-arg={v}" for v in value]
        elif key == "skip_tokenizer_init":
            out.append("--skip-tokenizer-init" if value else "--no-skip-tokenizer-init")
        elif key in load.OPTIONS:
            continue  # below, in the agent's words
        else:
            out.append(f"--{key.replace('_', '-')}={value}")
    serving = engine in ("vllm", "endpoint")
    return tuple(out) + (load.agent_args(args, slos_of(args)) if serving else ())


def plan_from_args(args, local_name: str, run_id: str | None = None) -> SoakPlan:
    """The soak the options ask for; bad input raises one of ``INPUT_ERRORS``."""
    engine = args.engine or ("endpoint" if args.endpoint else "burn")
    if engine == "endpoint" and not args.endpoint:
        raise UsageError("--engine endpoint needs --endpoint URL")
    serve_args = serving_args(args, engine)
    run_id = targets.run_id_of(args, run_id or new_run_id(local_name))
    if args.interval < 0.1:
        raise UsageError("--interval: at most 10 samples a second (>= 0.1 s)")
    ssh = targets.ssh_of(args)
    seconds = soak_seconds(args)
    slurm = targets.slurm_of(args)
    if slurm:
        check_time_limit(args, engine, seconds)
        hosts = targets.slurm_hosts_of(args, slurm)
        if not hosts:
            raise UsageError("--slurm: no nodes to soak")
    else:
        hosts = targets.hosts_of(args)
    agent_args = (("--bench", repr(args.bench)) if args.bench else ()) + serve_args
    if args.ib_interval is not None:
        agent_args += (f"--ib-interval={args.ib_interval!r}",)
    builtin = args.model if engine == "vllm" and args.model in builtin_models() else None
    poll = args.poll or (SLURM_POLL_S if slurm else POLL_S)
    return SoakPlan(run_id=run_id, out=args.out, engine=engine, seconds=seconds, interval_s=args.interval,
                    hosts=tuple(hosts), local_name=local_name, ssh=ssh, python=args.python,
                    node_dir=args.node_dir, agent_args=agent_args, builtin_model=builtin, poll_s=poll,
                    slurm=SlurmSoak(slurm) if slurm else None)


def soak_seconds(args) -> float:
    """The soak's planned length: a sweep's levels x steps, else --minutes / --hours (1 h)."""
    return load.sweep_seconds(args) or (args.minutes * 60 if args.minutes else (args.hours or 1.0) * 3600)


def needed_s(args, engine: str | None = None) -> float:
    """The allocation time a ``soak --slurm`` with these options needs (``slurm_soak.needed_s``)."""
    # The soak's drivers (rich.live, tarfile, paramiko at import) load for `soak` alone, not
    # before every `run`'s first connection; the parser above needs none of them.
    from preflight.soak import slurm_soak

    engine = engine or args.engine or ("endpoint" if args.endpoint else "burn")
    return slurm_soak.needed_s(soak_seconds(args), engine, args.ready_timeout, args.bench)


def check_time_limit(args, engine: str, seconds: float) -> None:
    """``--time`` must cover the soak: a job killed at its limit would cut the soak short."""
    from preflight.soak import slurm_soak  # for soak alone, as in needed_s

    if not args.time:
        return
    try:
        limit = time_limit_s(args.time)
    except ValueError as exc:
        raise UsageError(f"--time: {exc}") from None
    needed = needed_s(args, engine)
    if limit is not None and limit < needed:
        raise UsageError(f"--time {args.time}: the soak needs at least {slurm_soak.time_limit(needed)} minutes "
                         f"({seconds:g} s of soak plus {needed - seconds:g} s for start-up and collection)")


def cmd_soak(args, console: Console) -> int:
    # The soak's drivers (rich.live, tarfile, paramiko at import): for `soak` alone (needed_s).
    from preflight.soak import slurm_soak
    from preflight.soak.controller import analyze_and_show, follow
    from preflight.soak.ship import start  # likewise

    # Error messages name files and options: never folded inside a path, whatever the width.
    err = consoles.errors()
    try:
        # Its analysis and plots need the analysis extra: refused before any GPU is loaded.
        extras.require_analysis("preflight soak")
        if args.attach:
            plan = load_plan(args.out, args.attach)
            if any(getattr(args, k) for k in ("user", "port", "identity", "ssh_config", "known_hosts")):
                plan = replace(plan, ssh=targets.ssh_of(args))
            started = None
        else:
            plan = plan_from_args(args, local_host_name(), args.run_id)
        slos = slos_of(args)
        store = store_cli.store_of(args)
        if plan.slurm is not None and not args.attach:
            # Node states and allocations before anything is written: a request Slurm refuses
            # exits 2 and leaves nothing behind.
            plan = slurm_soak.allocate_soak(plan, needed_s(args))
    except INPUT_ERRORS as exc:
        err.print(f"preflight: error: {exc}", highlight=False, markup=False)
        return EXIT_USAGE
    # -q: the soak's one line at the end, nothing on the way (each node's start and state).
    along = consoles.make(quiet=True) if args.quiet else console
    try:
        if not args.attach:
            started = slurm_soak.start(plan, along) if plan.slurm is not None else start(plan, along)
        outcome = follow(plan, along, started, live=console.is_terminal and not args.quiet)
    except KeyboardInterrupt:
        again = f"preflight soak --attach {plan.run_id}" + (f" --out {args.out}" if args.out != Path("reports") else "")
        err.print(f"preflight soak: detached; the agents keep running. Re-attach with: {again}",
                  highlight=False, markup=False)
        return EXIT_INTERRUPTED
    failed = (analyze_and_show(outcome, console, slos, args.slo_budget, quiet=args.quiet)
              if outcome.merged["hosts"] else True)
    if not args.quiet or not (outcome.run_dir / "report.json").is_file():
        console.print(f"soak data: {outcome.run_dir}", highlight=False, markup=False)
    if (outcome.run_dir / "report.json").is_file():
        store_cli.record_report(store, outcome.run_dir, console)
    return EXIT_FAILED if failed or outcome.failed else EXIT_OK
