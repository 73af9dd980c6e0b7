"""The layout tells the architecture: who may import whom (docs/architecture.md), checked from the source."""

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "meshsim")


def _modules() -> dict[str, str]:
    found = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = "meshsim." + os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[module.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imports(module: str) -> set[str]:
    """Every module `module` imports, at its top or inside a function (both load code)."""
    path = MODULES[module]
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return out


GRAPH = {m: {i for i in _imports(m) if i in MODULES and i != m} for m in MODULES}


def test_no_module_of_meshsim_imports_itself_back_through_others():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert cycles == []


def _of(package: str) -> list[str]:
    return [m for m in MODULES if m == package or m.startswith(package + ".")]


# Lowest first. A module imports its own layer and those below, never one above (docs/architecture.md).
LAYERS = [
    ("vocabulary", ["meshsim.core"]),
    ("what to run", ["meshsim.spec"]),
    ("the torch boundary", ["meshsim.compat"]),
    ("the model's emulation", ["meshsim.model"]),
    ("operations", ["meshsim.ops"]),
    ("executors", ["meshsim.run"]),
    ("the culprit rule", ["meshsim.judge.blame"]),
    ("the model's prediction", ["meshsim.model.predict", "meshsim.model.classes", "meshsim.model.choices"]),
    ("the judge", ["meshsim.judge"]),
    ("the one path", ["meshsim.check", "meshsim.cluster"]),
    ("jobs", ["meshsim.sweep", "meshsim.scenario", "meshsim.launch", "meshsim.replay", "meshsim.examples"]),
    ("entry points", ["meshsim", "meshsim.cli", "meshsim.pytest_plugin", "meshsim.__main__"]),
]


def layer_of(module: str) -> int:
    matches = [(len(prefix), i) for i, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]
    return max(matches)[1]


def test_every_module_sits_in_a_layer():
    assert [m for m in MODULES if not [p for _, ps in LAYERS for p in ps if m == p or m.startswith(p + ".")]] == []


def test_the_top_of_meshsim_holds_only_the_api_the_cli_and_the_plugin():
    top = sorted(m for m, path in MODULES.items() if os.path.dirname(path) == ROOT and m.count(".") == 1)
    assert top == ["meshsim.__main__", "meshsim.check", "meshsim.cli", "meshsim.cluster", "meshsim.pytest_plugin"]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_layer_above_its_own(module):
    climbs = [f"{i} ({LAYERS[layer_of(i)][0]})" for i in sorted(GRAPH[module]) if layer_of(i) > layer_of(module)]
    assert climbs == [], f"{module} ({LAYERS[layer_of(module)][0]}) climbs to {climbs}"


@pytest.mark.parametrize("module", _of("meshsim.model"))
def test_the_model_imports_no_torch(module):
    assert not [i for i in _imports(module) if i.startswith("torch")]


@pytest.mark.parametrize("module", _of("meshsim.spec"))
def test_the_spec_is_pure_data_that_knows_no_operation(module):
    assert not [i for i in _imports(module) if i.startswith(("torch", "hypothesis", "meshsim.ops"))]


@pytest.mark.parametrize("module", _of("meshsim.run"))
def test_the_executors_import_nothing_of_the_model(module):
    assert not [i for i in _imports(module) if i.startswith("meshsim.model")]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_code_that_runs_on_the_ranks_imports_torch_distributed(module):
    on_ranks = module.startswith(("meshsim.run", "meshsim.ops", "meshsim.examples", "meshsim.compat"))
    # Tools that start no process group: torch's Flight Recorder reader and analyzer (replay reads dumps with
    # them), and torchrun's command-line parser and log routing (launch reads torchrun's flags with them).
    tools = ("torch.distributed.flight_recorder", "torch.distributed.run", "torch.distributed.elastic.multiprocessing",
             "torch.distributed.elastic.rendezvous.utils")
    if not on_ranks:
        assert not [i for i in _imports(module) if i.startswith("torch.distributed") and not i.startswith(tools)]


# The project's size rule (docs/architecture.md): a module a reader can hold, a function a reader can see whole.
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def test_no_module_of_meshsim_is_over_600_lines():
    lengths = {m: len(open(path).read().splitlines()) for m, path in MODULES.items()}
    assert {m: n for m, n in sorted(lengths.items()) if n > MAX_MODULE_LINES} == {}


def test_no_function_of_meshsim_is_over_80_lines():
    long = {}
    for module, path in sorted(MODULES.items()):
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{module}:{node.lineno} {node.name}"] = lines
    assert long == {}
