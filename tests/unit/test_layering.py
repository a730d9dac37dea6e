"""The layer rules of docs/architecture.md section 3, enforced on the AST of every minitrain module.

Imports go downward only, and `ls minitrain` shows the layers:
  L0 vocabulary  the top-level modules that name things (config/, knobs, errors, records, commands, run_state,
                 context, metrics, reporting, waits, lease, _session; storage.layout, storage.retention): stdlib
                 and each other only
  L1 primitives  rpc/, procs, storage/, hosts/, checkpoint, data/ (L0 + L1 + third-party, never torch; data/ is
                 L1 because the worker runtime builds dataset shards)
  L2 runtimes    coordinator/, agent/, worker/ (never each other, never L3); inside the coordinator, policy/ is
                 pure (L0 and itself only) and neither policy/ nor facts/ reaches the wire
  L3             the public surface (the package __init__, train_api, result, collective, minitrain.torch and the
                 other framework packages, tune/, callbacks/, dashboard/, launch/ the CLI) and the driver's own
                 packages: driver/ (fit() and what only its process needs) and monitoring/ (what watches a run)
Protobuf lives at the edges: only rpc/ and the `transport/` folders (coordinator/, agent/, worker/) import the
generated code.
Outside the package, bench/ (`python -m bench`, the benchmarks) uses only the public API and the
exported seams listed in BENCH_SEAMS; minitrain never imports it.
Only worker/ and minitrain/torch/ may import torch, at module level or inside a function; besides them,
minitrain.data.torch_batches imports it inside its functions (iter_torch_batches, in training functions).
The integrations minitrain.lightning and minitrain.huggingface import torch too (they run in workers).

Every import statement counts, wherever it is (functions, TYPE_CHECKING blocks), as do
`importlib.import_module("literal")` calls and `minitrain.<LazyName>` attribute uses of the lazy
package exports. A bare `import minitrain` is allowed anywhere: the package __init__ is lazy (the agent
reads `minitrain.__version__`). A new module must be given a layer below before this test passes.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import minitrain
import minitrain.torch as minitrain_torch

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "minitrain"
SKIP = {PACKAGE / "rpc" / "_gen"}  # generated code

# Module (or package prefix) -> layer. Names from the architecture that do not exist yet are listed so
# that adding them needs no edit here; anything else unlisted fails `test_every_module_has_a_layer`.
L0 = {"minitrain.config", "minitrain.knobs", "minitrain.errors", "minitrain.records", "minitrain.context",
      "minitrain.metrics", "minitrain.reporting", "minitrain.waits", "minitrain.lease",
      "minitrain._session", "minitrain._lazy", "minitrain.clock", "minitrain.storage.retention", "minitrain.storage.layout",
      "minitrain.commands",
      "minitrain.run_state"}  # the run's states, their allowed moves and the words users read
L1 = {"minitrain.rpc", "minitrain.procs", "minitrain.storage", "minitrain.hosts", "minitrain.checkpoint",
      "minitrain.net", "minitrain.data"}
L2_RUNTIMES = {"minitrain.coordinator", "minitrain.agent", "minitrain.worker"}
L3 = {"minitrain", "minitrain.driver", "minitrain.monitoring", "minitrain.train_api", "minitrain.result",
      "minitrain.torch", "minitrain.launch", "minitrain.collective", "minitrain.lightning", "minitrain.huggingface",
      "minitrain.tune",  # tune: Ray Tune's Tuner, built on TorchTrainer.fit()
      "minitrain.callbacks",  # RunConfig.callbacks: UserCallback, the trackers and their runner (an observer)
      "minitrain.dashboard",  # dashboard: the web page and /metrics over the run monitor
      # XGBoostTrainer, LightGBMTrainer and their report callbacks; _gbdt: what the two share
      "minitrain.xgboost", "minitrain.lightgbm", "minitrain._gbdt",
      # TensorflowTrainer, its Keras callback, and Ray's older ray.air.integrations.keras path to it
      "minitrain.tensorflow", "minitrain.air",
      "minitrain.jax"}  # JaxTrainer and JaxConfig
# minitrain.data.torch_batches: only `iter_torch_batches` (inside a training function) calls it, and it
# imports torch inside its functions, so the driver and `import minitrain.data` stay free of torch.
TORCH_ALLOWED = {"minitrain.worker", "minitrain.torch", "minitrain.data.torch_batches"}
# minitrain.lightning and minitrain.huggingface: user-side integrations that run inside training functions.
TORCH_ALLOWED = TORCH_ALLOWED | {"minitrain.lightning", "minitrain.huggingface"}
# XGBoost and LightGBM: like torch, never in the driver's runtime (coordinator) or the agents; the worker
# runs their collective layers (worker.xgboost_backend, worker.lightgbm_backend) and the public packages
# hold the callbacks that run inside training functions.
GBDT_LIBRARIES = {"xgboost", "lightgbm"}
GBDT_ALLOWED = {"minitrain.worker", "minitrain.xgboost", "minitrain.lightgbm"}
# TensorFlow and Keras, by the same rule: minitrain.tensorflow (the Keras callback, prepare_dataset_shard,
# TensorflowCheckpoint's loading) and, inside its functions, minitrain.data.tf_batches (DataIterator.to_tf).
TF_LIBRARIES = {"tensorflow", "keras", "tf_keras"}
TF_ALLOWED = {"minitrain.worker", "minitrain.tensorflow", "minitrain.data.tf_batches"}
# JAX, by the same rule: the worker brings up jax.distributed (worker.jax_backend); minitrain.jax may use it
# in what runs inside training functions. The driver builds a JaxTrainer without it.
JAX_LIBRARIES = {"jax", "jaxlib", "orbax"}
JAX_ALLOWED = {"minitrain.worker", "minitrain.jax"}
# What bench/ may use besides the public API (L3 and the lazy package exports): the coordinator run
# entry with its RunObserver seam (the scale simulation serves fake agents over the wire protocol),
# WorkerSession.phase_seconds through _session, and the building blocks a coordinator run is given.
BENCH_SEAMS = {"minitrain._session", "minitrain.config", "minitrain.coordinator.run",
               "minitrain.coordinator.controller", "minitrain.coordinator.facts.metrics_log", "minitrain.driver.logs",
               "minitrain.rpc", "minitrain.storage", "minitrain.hosts.ssh",
               "minitrain.monitoring.monitor",  # bench scale runs TorchTrainer's RunMonitor beside run_coordinator
               # bench ddp times the telemetry bookkeeping of one report() and one sample directly
               "minitrain.waits", "minitrain.worker.telemetry",
               # the GPU check times report()'s parts (encoding, the queued record) on the machine
               "minitrain.metrics", "minitrain.worker.transport.client",
               # bench ledger times a run's claim on the host's resource ledger directly (the ledger's benchmark rows)
               "minitrain.hosts.reserve", "minitrain.hosts.hold", "minitrain.hosts.demand", "minitrain.hosts.hostinfo",
               # the fake agents heartbeat and coalesce with the real agent's interval and caps
               "minitrain.lease", "minitrain.agent.transport.relay"}
LAZY_EXPORTS = {"minitrain": dict(minitrain._EXPORTS), "minitrain.torch": dict(minitrain_torch._LAZY)}
# House rule 3, protobuf only at the edges: the generated code (minitrain.rpc._gen) is imported only by rpc/
# (which converts between messages and records: minitrain.rpc.convert) and the `transport/` folders of the
# runtimes, which carry them. In bench/, the scale simulation's fake agents and workers speak the wire protocol
# (bench.scale.clients and bench.scale.fake_worker, and their streams in bench.scale.links).
BENCH_TRANSPORT = {"bench.scale.clients", "bench.scale.fake_worker", "bench.scale.links"}


def is_transport(module: str) -> bool:
    """rpc/, a module in a runtime's `transport/` folder, or one of bench's fake clients."""
    return _within(module, "minitrain.rpc") or ".transport." in module + "." or module in BENCH_TRANSPORT


GENERATED = "minitrain.rpc._gen"


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _longest(module: str, prefixes: set[str]) -> str | None:
    matches = [p for p in prefixes if _within(module, p)]
    return max(matches, key=len) if matches else None


def layer_of(module: str) -> tuple[int, str] | None:
    """(layer, group) of a minitrain module; the group is the L2 runtime or the matched name."""
    best: tuple[int, str] | None = None
    for level, names in ((0, L0), (1, L1), (2, L2_RUNTIMES), (3, L3)):
        match = _longest(module, names)
        if match is not None and (best is None or len(match) > len(best[1])):
            best = (level, match)
    return best


@dataclass(frozen=True)
class Import:
    target: str  # dotted module name
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if any(skip in path.parents for skip in SKIP):
            continue
        found.append((module_name(path), path))
    return found


def _is_package_module(dotted: str) -> bool:
    rel = Path(*dotted.split("."))
    return (ROOT / rel).with_suffix(".py").exists() or (ROOT / rel / "__init__.py").exists()


def _resolve_from(base: str, name: str) -> str:
    """`from base import name` -> the module it really loads."""
    candidate = f"{base}.{name}"
    if base.split(".")[0] == "minitrain" and _is_package_module(candidate):
        return candidate
    lazy = LAZY_EXPORTS.get(base, {})
    return lazy.get(name, base)


def imports_of(module: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    package_parts = module.split(".") if is_package else module.split(".")[:-1]
    bare_minitrain_aliases = set()
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(alias.name, node.lineno))
                if alias.name == "minitrain":
                    bare_minitrain_aliases.add(alias.asname or "minitrain")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package_parts[: len(package_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                found.append(Import(_resolve_from(base, alias.name), node.lineno))
        elif isinstance(node, ast.Call):
            func = node.func
            named = (isinstance(func, ast.Attribute) and func.attr == "import_module") or \
                    (isinstance(func, ast.Name) and func.id in ("import_module", "__import__"))
            if named and node.args and isinstance(node.args[0], ast.Constant) and \
                    isinstance(node.args[0].value, str):
                found.append(Import(node.args[0].value, node.lineno))
    # `import minitrain` then `minitrain.report(...)`: the lazy export loads its real module.
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                node.value.id in bare_minitrain_aliases and node.attr in LAZY_EXPORTS["minitrain"]:
            found.append(Import(LAZY_EXPORTS["minitrain"][node.attr], node.lineno))
    return found


def _top(name: str) -> str:
    return name.split(".")[0]


def violations_of(module: str, path: Path) -> list[str]:
    own = layer_of(module)
    assert own is not None, module
    level, group = own
    problems = []
    where = str(path.relative_to(ROOT)) if ROOT in path.parents else str(path)
    for imp in imports_of(module, path):
        target, top = imp.target, _top(imp.target)
        at = f"{where}:{imp.line} imports {target}"
        if top == "torch":
            if not any(_within(module, allowed) for allowed in TORCH_ALLOWED):
                problems.append(f"{at}: only worker/ and minitrain/torch/ may import torch")
            continue
        if top in GBDT_LIBRARIES:
            if not any(_within(module, allowed) for allowed in GBDT_ALLOWED):
                problems.append(f"{at}: only worker/, minitrain.xgboost and minitrain.lightgbm may import {top}")
            continue
        if top in TF_LIBRARIES:
            if not any(_within(module, allowed) for allowed in TF_ALLOWED):
                problems.append(f"{at}: only worker/, minitrain.tensorflow and minitrain.data.tf_batches may "
                                f"import {top}")
            continue
        if top in JAX_LIBRARIES:
            if not any(_within(module, allowed) for allowed in JAX_ALLOWED):
                problems.append(f"{at}: only worker/ and minitrain.jax may import {top}")
            continue
        if top != "minitrain":
            if level == 0 and top not in sys.stdlib_module_names:
                problems.append(f"{at}: L0 modules use the standard library only")
            continue
        if target == "minitrain":
            continue  # the lazy package __init__ (e.g. for __version__)
        theirs = layer_of(target)
        if theirs is None:
            problems.append(f"{at}: {target} has no layer (add it to test_layering.py)")
            continue
        their_level, their_group = theirs
        if their_level > level:
            problems.append(f"{at}: L{level} must not import L{their_level} ({their_group})")
        elif level == 2 and their_level == 2 and their_group != group:
            problems.append(f"{at}: runtimes never import each other ({group} -> {their_group})")
    return problems


# ---------------------------------------------------------------------------------- tests


def test_every_module_has_a_layer():
    missing = [module for module, _ in source_modules() if layer_of(module) is None]
    assert not missing, f"give these modules a layer in tests/unit/test_layering.py: {missing}"


def test_walker_sees_the_modules_it_should():
    names = {module for module, _ in source_modules()}
    for expected in ("minitrain", "minitrain.config", "minitrain.rpc.auth", "minitrain.coordinator.policy.decide",
                     "minitrain.agent.agent", "minitrain.worker.bootstrap", "minitrain.driver.trainer"):
        assert expected in names
    assert not any(name.startswith("minitrain.rpc._gen") for name in names)


def test_resolver_on_known_imports():
    agent = dict(source_modules())["minitrain.agent.agent"]
    targets = {imp.target for imp in imports_of("minitrain.agent.agent", agent)}
    assert {"minitrain", "minitrain.hosts.hostinfo", "minitrain.procs", "minitrain.commands"} <= targets
    stream = dict(source_modules())["minitrain.agent.transport.stream"]
    assert "minitrain.rpc.auth" in {imp.target for imp in imports_of("minitrain.agent.transport.stream", stream)}
    distributed = dict(source_modules())["minitrain.worker.distributed"]
    assert "torch" in {imp.target for imp in imports_of("minitrain.worker.distributed", distributed)}


def test_the_checker_catches_upward_and_torch_imports(tmp_path):
    """The rules themselves work: a planted bad module is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("import minitrain\nfrom minitrain.driver.trainer import TorchTrainer\n"
                   "from minitrain import report\n\n"
                   "def f():\n    import torch\n    from minitrain.agent import agent\n"
                   "    return minitrain.Result\n")
    problems = violations_of("minitrain.coordinator.bad", bad)
    text = "\n".join(problems)
    assert "minitrain.driver.trainer" in text and "minitrain.train_api" in text and "minitrain.result" in text
    assert "torch" in text and "runtimes never import each other" in text
    assert len(problems) == 5, text


def test_the_checker_keeps_xgboost_and_lightgbm_out_of_the_supervisors(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    import xgboost\n    from lightgbm import Booster\n")
    assert len(violations_of("minitrain.coordinator.bad", bad)) == 2
    assert violations_of("minitrain.worker.bad", bad) == []


def test_the_checker_keeps_jax_out_of_the_driver_and_the_supervisors(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import jax\n\ndef f():\n    from jax.experimental import multihost_utils\n    import orbax.checkpoint\n")
    for module in ("minitrain.driver.bad", "minitrain.coordinator.bad", "minitrain.agent.bad"):
        assert len(violations_of(module, bad)) == 3, module
    assert violations_of("minitrain.worker.bad", bad) == violations_of("minitrain.jax.bad", bad) == []


@pytest.mark.parametrize(("module", "path"), source_modules(), ids=[m for m, _ in source_modules()])
def test_module_respects_the_layers(module, path):
    problems = violations_of(module, path)
    assert not problems, "\n".join(problems)


def _import_graph() -> dict[str, set[str]]:
    """module -> the minitrain modules it imports (a bare `import minitrain` left out: the package is lazy)."""
    modules = dict(source_modules())
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for imp in imports_of(name, path):
            target = imp.target
            while target and target not in modules:  # `from pkg.mod import Class` -> pkg.mod
                target = target.rpartition(".")[0]
            if target and target not in (name, "minitrain"):
                graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_import_graph_has_no_cycle():
    assert _cycles(_import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_bench_uses_only_the_public_api_and_exported_seams():
    exported = {module for names in LAZY_EXPORTS.values() for module in names.values()}
    allowed = (L3 - {"minitrain"}) | BENCH_SEAMS | exported  # "minitrain" alone would match every module
    bench = ROOT / "bench"
    problems = []
    for path in sorted(bench.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for imp in imports_of(name, path):
            if _top(imp.target) == "minitrain" and imp.target != "minitrain" and _longest(imp.target, allowed) is None:
                problems.append(f"{path.relative_to(ROOT)}:{imp.line} imports {imp.target}")
    assert not problems, "bench/ reaches past the public API and the exported seams:\n" + "\n".join(problems)


def test_minitrain_never_imports_bench():
    users = [f"{module}:{imp.line}" for module, path in source_modules() for imp in imports_of(module, path)
             if _top(imp.target) == "bench"]
    assert not users, users


def test_only_the_transport_modules_import_the_generated_protobuf_code():
    bench = [(".".join(p.relative_to(ROOT).with_suffix("").parts), p) for p in sorted((ROOT / "bench").rglob("*.py"))]
    importers = {module for module, path in source_modules() + bench
                 if any(_within(imp.target, GENERATED) for imp in imports_of(module, path))}
    strays = sorted(m for m in importers if not is_transport(m))
    assert not strays, f"only rpc/ and the transport/ folders may import {GENERATED} (convert in minitrain.rpc.convert): " \
                       f"{strays}"
    # A transport/ folder holds the wire edge only: each of its modules speaks protobuf.
    idle = sorted(m for m, _ in source_modules() if ".transport." in m and m not in importers)
    assert not idle, f"these transport/ modules no longer import {GENERATED}: move them out of transport/: {idle}"


def test_the_coordinator_policy_is_pure_and_its_facts_never_reach_the_wire():
    """policy/ imports only L0 and itself (no I/O, no clock, no threads); facts/ records and sends through the
    Outbox, never through rpc/ or transport/; the controller and the current attempt neither."""
    modules = dict(source_modules())
    policy = "minitrain.coordinator.policy"
    for name, path in modules.items():
        targets = {imp.target for imp in imports_of(name, path) if _top(imp.target) == "minitrain"} - {"minitrain"}
        if _within(name, policy):
            impure = sorted(t for t in targets if not _within(t, policy) and (layer_of(t) or (9,))[0] != 0)
            assert not impure, (name, impure)
            stdlib = {imp.target for imp in imports_of(name, path)} & {"threading", "time", "socket", "os", "asyncio"}
            assert not stdlib, (name, sorted(stdlib))
        if _within(name, "minitrain.coordinator.facts") or name in (
                "minitrain.coordinator.current_attempt", "minitrain.coordinator.controller"):
            wire = sorted(t for t in targets if is_transport(t))
            assert not wire, (name, wire)
