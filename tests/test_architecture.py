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


@pytest.mark.parametrize("module", _of("meshsim.model"))
def test_the_model_imports_no_torch_and_nothing_above_it(module):
    allowed = ("meshsim.model", "meshsim.spec", "meshsim.wire", "meshsim.errors")
    imported = _imports(module)
    assert not [i for i in imported if i.startswith("torch")]
    assert not [i for i in imported if i.startswith("meshsim") and not i.startswith(allowed)]


@pytest.mark.parametrize("module", _of("meshsim.spec"))
def test_the_spec_is_pure_data_that_knows_no_operation(module):
    allowed = ("meshsim.spec", "meshsim.wire", "meshsim.deadlines", "meshsim.errors")
    imported = _imports(module)
    assert not [i for i in imported if i.startswith(("torch", "hypothesis"))]
    assert not [i for i in imported if i.startswith("meshsim") and not i.startswith(allowed)]


@pytest.mark.parametrize("module", _of("meshsim.run"))
def test_the_executors_import_nothing_of_the_model_or_the_judge(module):
    assert not [i for i in _imports(module) if i.startswith(("meshsim.model", "meshsim.judge", "meshsim.predict",
                                                               "meshsim.check", "meshsim.cluster"))]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_code_that_runs_on_the_ranks_imports_torch_distributed(module):
    on_ranks = module.startswith(("meshsim.run", "meshsim.ops", "meshsim.examples"))
    # Tools that start no process group: torch's Flight Recorder reader and analyzer (replay reads dumps with
    # them), and torchrun's command-line parser and log routing (launch reads torchrun's flags with them).
    tools = ("torch.distributed.flight_recorder", "torch.distributed.run", "torch.distributed.elastic.multiprocessing",
             "torch.distributed.elastic.rendezvous.utils")
    if not on_ranks:
        assert not [i for i in _imports(module) if i.startswith("torch.distributed") and not i.startswith(tools)]
