"""Run a training function or a whole script under minitrain from the command line (L3).

    python -m minitrain.launch --num-workers 2 examples/quickstart.py:train_func --config '{"epochs": 3}'
    python -m minitrain.launch examples/quickstart.py --epochs 3
    python -m minitrain.launch --status          # what each host's resource ledger holds now
    python -m minitrain.launch --join HOST:PORT --node-id NAME --run-id ID --token-file PATH

`--join` starts an agent that joins a run by itself, and under a Kubernetes training job (PyTorchJob
or TrainJob variables) the same command on every pod runs the driver on pod 0 and a joining agent on
the others (`minitrain.launch.join_cli`, docs/kubernetes.md).

With `FILE.py:FUNCTION`, the function is trained by a `TorchTrainer` built from the options. With a
plain `FILE.py`, the script runs as `__main__` (it builds its own trainer) with the remaining
arguments as its `sys.argv[1:]`.

A mistake found before any process starts (a `ConfigError`, a Ray argument minitrain refuses) ends
with one line on stderr and exit code 2; `--debug` adds its traceback. Ctrl-C ends with the line
fit() wrote (what was stopped, what the same command resumes from) and exit code 130, as a shell
reports a process SIGINT ended. A preempted run (`PreemptionError`: a preemption signal reached the
driver or a node agent, every rank checkpointed at the agreed round) ends with exit code 143 (128 +
SIGTERM: what a scheduler expects of a process it asked to stop, and retryable under Kubeflow's
ExitCode restart policy) while `FailureConfig.max_preemption_failures` allows a resume, and with 1 once
it does not. A run that stopped because `FailureConfig.max_attempts_without_progress` attempts in a row
failed without progress (`NoProgressError`) ends with exit code 93 (NVIDIA's resiliency extension's
"do not restart": a Slurm job is not requeued for it, a Kubernetes job is told to fail on it); any other
failed run with 1. A script target's exit code is the script's own, except that a `PreemptionError` the
script lets escape ends as the function target's would (143, or 1 when not resumable) rather than as
any uncaught exception (1): a script of a Kubernetes pod need not catch it for its pod to be retried;
and a `NoProgressError` it lets escape ends with 93, so that its pod is not retried.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import runpy
import sys
import traceback
from typing import Callable, Optional

_USER_MODULE = "__minitrain_user_module__"
EXIT_USAGE = 2  # a mistake in the command or its configs, found before any process started
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C
EXIT_PREEMPTED = 143  # 128 + SIGTERM: preempted at an agreed checkpoint; run the same command to resume
# Attempts in a row failed without progress (NoProgressError): do not run it again as it is. NVIDIA's
# resiliency extension's "do not restart" code; below 128, so final under Kubeflow's ExitCode policy.
EXIT_NO_PROGRESS = 93
logger = logging.getLogger("minitrain")


def build_parser() -> argparse.ArgumentParser:
    """The CLI's argument parser."""
    parser = argparse.ArgumentParser(
        prog="python -m minitrain.launch",
        description="Train a function (FILE.py:FUNCTION) or run a script (FILE.py) under minitrain.",
    )
    parser.add_argument("target", nargs="?", help="FILE.py:FUNCTION to train, or FILE.py to run as __main__ "
                        "(every argument after FILE.py goes to the script)")
    parser.add_argument("--status", action="store_true",
                        help="list what each host's resource ledger holds now (the hosts of --hosts/--hostfile, "
                        "else MINITRAIN_HOSTS, else this machine) and exit")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error found before training starts")
    joining = parser.add_argument_group("agents that join (docs/joining.md, docs/kubernetes.md)")
    joining.add_argument("--join", default=None, metavar="HOST:PORT",
                         help="start an agent that joins the run whose coordinator listens at HOST:PORT")
    joining.add_argument("--node-id", default=None, help="with --join: this host's name in the run")
    joining.add_argument("--run-id", default=None, help="with --join: the run's id (its JoinConfig.run_id)")
    joining.add_argument("--token-file", default=None, help="the file holding the run token (default: "
                         "MINITRAIN_JOIN_TOKEN_FILE, else MINITRAIN_JOIN_TOKEN; never on the command line)")
    group = parser.add_argument_group("trainer options (FILE.py:FUNCTION only)")
    group.add_argument("--num-workers", type=int, default=1, help="worker processes (default 1; 0 = in this process)")
    group.add_argument("--use-gpu", action="store_true", help="one GPU per worker, NCCL backend")
    group.add_argument("--config", default=None, help="train_loop_config as a JSON object")
    group.add_argument("--name", default=None, help="run name under the storage path (the resume key)")
    group.add_argument("--storage-path", default=None, help="run directory root (default ~/minitrain_results)")
    group.add_argument("--max-failures", type=int, default=0, help="restarts allowed (-1 = unlimited)")
    group.add_argument("--backend", default=None, choices=("gloo", "nccl"), help="torch.distributed backend")
    hosts = parser.add_argument_group("hosts (both targets; default: the Slurm allocation inside one, else this "
                                      "machine only)")
    hosts.add_argument("--hosts", default=None, help="comma-separated hosts, e.g. gpu1:8,gpu2:8 (host:slots)")
    hosts.add_argument("--hostfile", default=None, help="DeepSpeed/MPI hostfile: 'host slots=N' per line")
    hosts.add_argument("--ssh-user", default=None)
    hosts.add_argument("--ssh-port", type=int, default=None)
    hosts.add_argument("--ssh-identity-file", default=None)
    hosts.add_argument("--ssh-known-hosts-file", default=None, help="known_hosts file to check host keys against")
    hosts.add_argument("--ssh-option", action="append", default=[], metavar="KEY=VALUE",
                       help="an extra ssh -o option (repeatable)")
    hosts.add_argument("--accept-new-host-keys", action="store_true",
                       help="accept unknown host keys (default: only keys already in known_hosts)")
    hosts.add_argument("--forward-env", action="append", default=[], metavar="NAME",
                       help="forward this driver environment variable to every worker (repeatable)")
    return parser


def _init_cluster(options: argparse.Namespace) -> None:
    """minitrain.init(...) from the host options, when any was given."""
    if not (options.hosts or options.hostfile):
        return
    import minitrain

    minitrain.init(hosts=options.hosts, hostfile=options.hostfile, ssh_user=options.ssh_user,
                   ssh_port=options.ssh_port, ssh_identity_file=options.ssh_identity_file,
                   ssh_known_hosts_file=options.ssh_known_hosts_file,
                   ssh_options=tuple(options.ssh_option), accept_new_host_keys=options.accept_new_host_keys,
                   env_vars_to_forward=tuple(options.forward_env))


_VALUE_OPTIONS = {"--num-workers", "--config", "--name", "--storage-path", "--max-failures", "--backend",
                  "--hosts", "--hostfile", "--ssh-user", "--ssh-port", "--ssh-identity-file", "--ssh-option",
                  "--ssh-known-hosts-file", "--join", "--node-id", "--run-id", "--token-file",
                  "--forward-env"}


def split_target(argv: list[str]) -> tuple[list[str], Optional[str], list[str]]:
    """(options before the target, the target, everything after it). None when there is no target."""
    index = 0
    while index < len(argv):
        token = argv[index]
        if token in _VALUE_OPTIONS:
            index += 2
            continue
        if not token.startswith("-"):
            return argv[:index], token, argv[index + 1:]
        index += 1
    return argv, None, []


def _load_function(path: str, function_name: str) -> Callable:
    """Import FILE.py as a module whose code is pickled by value (workers need not find the file)."""
    import cloudpickle

    if not os.path.isfile(path):
        raise SystemExit(f"minitrain.launch: no such file: {path}")
    directory = os.path.dirname(os.path.abspath(path))
    if directory not in sys.path:
        sys.path.insert(0, directory)
    spec = importlib.util.spec_from_file_location(_USER_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_USER_MODULE] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    function = getattr(module, function_name, None)
    if not callable(function):
        raise SystemExit(f"minitrain.launch: {path} has no function {function_name!r}")
    return function


def _train_function(options: argparse.Namespace, path: str, function_name: str) -> int:
    import minitrain
    from minitrain import FailureConfig, RunConfig, ScalingConfig
    from minitrain.config import TorchConfig
    from minitrain.torch import TorchTrainer

    try:
        config = json.loads(options.config) if options.config else {}
    except json.JSONDecodeError as exc:
        raise SystemExit(f"minitrain.launch: --config is not valid JSON ({exc}); pass e.g. '{{\"epochs\": 3}}'")
    if not isinstance(config, dict):
        raise SystemExit("minitrain.launch: --config must be a JSON object, e.g. '{\"epochs\": 3}'")
    function = _load_function(path, function_name)
    trainer = TorchTrainer(
        function,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=options.num_workers, use_gpu=options.use_gpu),
        run_config=RunConfig(name=options.name, storage_path=options.storage_path,
                             failure_config=FailureConfig(max_failures=options.max_failures)),
        torch_config=TorchConfig(backend=options.backend),
    )
    try:
        result = trainer.fit()
    except minitrain.PreemptionError as exc:
        print(f"minitrain.launch: preempted\n{exc}", file=sys.stderr)
        return EXIT_PREEMPTED if exc.resumable else 1
    except minitrain.NoProgressError as exc:
        return _no_progress(exc)
    except minitrain.TrainingFailedError as exc:
        print(f"minitrain.launch: training failed\n{exc}", file=sys.stderr)
        return 1
    print(f"minitrain.launch: finished; metrics: {json.dumps(result.metrics)}; run directory: {result.path}")
    return 0


def _status(options: argparse.Namespace) -> int:
    """--status: what each host's resource ledger holds now (minitrain.hosts.reserve.ledger_report)."""
    import minitrain
    from minitrain.hosts.cluster import current_cluster
    from minitrain.hosts.reserve import ledger_report

    _init_cluster(options)
    # A remote host imports this minitrain, as the agents do (the hosts share the install).
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(minitrain.__file__)))
    print(ledger_report(current_cluster(), (package_root,)))
    return 0


def _run_script(path: str, script_args: list[str]) -> int:
    if not os.path.isfile(path):
        raise SystemExit(f"minitrain.launch: no such file: {path}")
    sys.argv = [path, *script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    import minitrain

    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except minitrain.PreemptionError as exc:
        print(f"minitrain.launch: preempted\n{exc}", file=sys.stderr)
        return EXIT_PREEMPTED if exc.resumable else 1
    except minitrain.NoProgressError as exc:
        return _no_progress(exc)
    return 0


def _no_progress(error: BaseException) -> int:
    """Say that the run stopped without progress and return its exit code (the function's and a script's)."""
    print(f"minitrain.launch: training failed without progress; not to be restarted as it is\n{error}",
          file=sys.stderr)
    return EXIT_NO_PROGRESS


def main(argv: Optional[list[str]] = None) -> int:
    """Parse `argv` and run; returns the exit code (see the module docstring)."""
    from minitrain.errors import ConfigError

    argv = sys.argv[1:] if argv is None else argv
    try:
        return _main(argv)
    except KeyboardInterrupt as interrupt:
        if not interrupt.args:  # with args, fit() has already said what it stopped and how to resume
            print("minitrain.launch: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ConfigError, DeprecationWarning) as exc:  # before any process started: one clear line
        if "--debug" in split_target(argv)[0]:
            traceback.print_exc()
        else:
            logger.debug("minitrain.launch: the traceback of the error below", exc_info=True)
        print(f"minitrain.launch: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _main(argv: list[str]) -> int:
    from minitrain.hosts import kubernetes_env
    from minitrain.launch import join_cli

    before, target, after = split_target(argv)
    parser = build_parser()
    if target is None:
        options = parser.parse_args(before)
        if options.join:
            return join_cli.run_joiner(options.join, options.node_id, options.run_id, options.token_file)
        if not options.status:
            parser.error("the following arguments are required: target")
        return _status(options)
    pre = parser.parse_args(before)
    pod = None if (pre.hosts or pre.hostfile) else kubernetes_env.pod_from_environment()
    if pod is not None:  # every pod runs this same command: pod 0 the driver, the others join it
        code = join_cli.kubernetes_pod_main(pod, pre.token_file)
        if code is not None:
            return code
    path, colon, function_name = target.rpartition(":")
    if not colon or not function_name.isidentifier():
        options = parser.parse_args([*before, target])  # options before a script are still checked
        _init_cluster(options)
        return _run_script(target, after)
    options = parser.parse_args([*before, target, *after])
    _init_cluster(options)
    return _train_function(options, path, function_name)
