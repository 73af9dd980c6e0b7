"""Hypothesis strategies for topologies, meshes and plans of mesh operations.

Plans are built step by step while the reference model (rank 0's view; plans here are SPMD) follows
along, so each step can only name handles that exist and shapes that fit. Illegal requests (slices out of
order, repeated or unknown names, flatten name clashes, unflatten sizes that do not multiply, overlapping
concatenations, meshes larger than the world) are drawn on purpose: the model says which error torch must
raise. Every choice is a plain Hypothesis draw, so failures shrink to short plans on few ranks.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import event
from hypothesis import strategies as st

from ..model.mesh import MeshModel
from ..model.predict import RankRun, observe_step
from ..ops import OPERATIONS, of_role, rarely
from ..ops.meshes import dim_names, mesh_shapes, rank_layouts, well_named  # noqa: F401 -- part of this module's API
from ..ops.validate import runs_on
from ..spec.plan import Plan, Step, step
from ..spec.platform import Platform
from ..spec.topology import Topology
from .cells import DTENSOR_COMPOSITIONS, dtensor_compositions, transform_cells  # noqa: F401 -- API
from .compose import compositions
from .matrix import matrix_plans  # noqa: F401 -- part of this module's API


def topologies(max_world: int = 16, max_hosts: int = 4, max_devices: int = 8) -> st.SearchStrategy[Topology]:
    return st.builds(Topology, st.integers(1, max_hosts), st.integers(1, max_devices)).filter(
        lambda t: t.world <= max_world)


# --------------------------------------------------------------------------------------------- plans


class _Builder:
    """A plan being drawn, with the model following rank 0 to know what each handle holds. `device`: the device
    type the cluster's backend serves, the one an explicit `device=` names (cpu on gloo, cuda on NCCL);
    `platform`: the torch the ranks run (its release decides which operations exist)."""

    def __init__(self, world: int, device: str = "cpu", platform: Platform | None = None):
        self.world = world
        self.device = device
        self.run = RankRun(Plan(()), 0, world, platform or Platform())
        self.platform = self.run.model.platform
        self.steps: list[Step] = []
        self.left_out: set[str] = set()  # handles of steps the release cannot run (meshsim.model.semantics)
        self.counter = 0

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def add(self, st_: Step) -> None:
        if not self._available(st_):
            return
        self.run.model.step = len(self.steps)
        try:
            observe_step(self.run, st_, st_.args_for(0), len(self.steps))
        except Exception:  # noqa: BLE001 -- a model that fails here is judged when the plan runs
            pass
        self.steps.append(st_)

    def _available(self, st_: Step) -> bool:
        return runs_on(st_, self.platform, self.left_out)

    def meshes(self) -> list[tuple[str, MeshModel]]:
        out = []
        for name, value in self.run.handles.items():
            if isinstance(value, MeshModel):
                out.append((name, value))
            elif isinstance(value, list):
                out.extend((f"{name}.{i}", m) for i, m in enumerate(value) if isinstance(m, MeshModel))
        return out

    def plan(self) -> Plan:
        return Plan(tuple(self.steps))


@st.composite
def root_steps(draw: Any, world: int, allow_errors: bool = True, numel: int | None = None,
               builder: _Builder | None = None) -> Step:
    """A step that makes a root mesh: init_device_mesh, or DeviceMesh with an explicit rank layout (named by
    `builder`, so that a plan's roots never share a handle)."""
    b = builder or _Builder(world)
    root = draw(st.sampled_from(of_role("root")))
    return draw(root.draw(b, None, None, allow_errors, numel=numel))


# What plans() draws: every operation by its own weight (meshsim.ops), and three moves of its own: "root" adds
# another independent mesh, "composition" and "dtensor" a deep chain of steps (COMPOSITIONS,
# DTENSOR_COMPOSITIONS) that a random walk rarely completes.
WEIGHTS = {**{op.name: op.weight for op in OPERATIONS.values() if op.weight}, "root": 1, "composition": 5,
           "dtensor": 5}


@st.composite
def plans(draw: Any, world: int, max_steps: int = 6, allow_errors: bool = True,
          check_every_mesh: bool = False, root_numel: int | None = None, device: str = "cpu",
          platform: Platform | None = None) -> Plan:
    """SPMD plans: a root mesh, then more roots, derived meshes, deep compositions, queries, collectives and
    checks that use earlier results.

    Each plan enables a random subset of the operations (swarm testing), so rare combinations get room.
    """
    b = _Builder(world, device, platform)
    b.add(draw(root_steps(world, allow_errors, numel=root_numel, builder=b)))
    names = sorted(n for n in WEIGHTS if n not in OPERATIONS or OPERATIONS[n].available(b.platform))
    enabled = draw(st.sets(st.sampled_from(names), min_size=1)) if draw(st.booleans()) else set(names)
    menu = [n for n in names if n in enabled for _ in range(WEIGHTS[n])]
    for _ in range(draw(st.integers(0, max_steps - 1))):
        meshes = b.meshes()
        if not meshes:
            break
        handle, mesh = draw(st.sampled_from(meshes))
        choice = draw(st.sampled_from(menu))
        event(f"drew {choice}")  # pytest --hypothesis-show-statistics: how often each kind of step is drawn
        if choice in ("composition", "dtensor"):
            draw((compositions if choice == "composition" else dtensor_compositions)(b, handle, mesh, allow_errors))
            continue
        made = draw(root_steps(world, allow_errors, builder=b) if choice == "root" else
                    OPERATIONS[choice].draw(b, handle, mesh, allow_errors))
        if made is not None:
            b.add(made)
            if check_every_mesh and made.out and made.out in b.run.handles:
                b.add(step("check", mesh=made.out))
    if "dtensor" in enabled and b.meshes() and rarely(draw, 3):
        # a cell of the redistribute matrix, drawn directly (a random walk reaches few; drawn last, where shrinking
        # drops it first): a sweep produces and checks every cell, under every condition (meshsim.sweep.produced)
        handle, mesh = b.meshes()[0]
        draw(transform_cells(b, handle, mesh, allow_errors))
    checked = {s.args.get("mesh") for s in b.steps if s.op == "check"}
    unchecked = [h for h, _ in b.meshes() if h not in checked]
    if unchecked:
        b.add(step("check", mesh=unchecked[-1]))
    return b.plan()


@st.composite
def topology_plans(draw: Any, topologies: list[Topology] | None = None, max_steps: int = 6,
                   allow_errors: bool = True) -> tuple[Topology, Plan]:
    """A topology and a plan for its world, shrinking toward small worlds.

    The root mesh's size is drawn first and the topology follows it (the smallest that holds it, or a larger
    one drawn on top): when a failing root mesh shrinks, the world shrinks with it, and the rest of the plan
    keeps its meaning.
    """
    choices = sorted(topologies or [Topology(1, 2), Topology(2, 2), Topology(2, 4), Topology(4, 4)],
                     key=lambda t: (t.world, t.hosts))
    sizes = sorted({t.world for t in choices})
    numel = draw(st.sampled_from(sizes))
    fitting = [t for t in choices if t.world >= numel]
    topology = fitting[draw(st.integers(0, len(fitting) - 1))]
    return topology, draw(plans(topology.world, max_steps=max_steps, allow_errors=allow_errors, root_numel=numel))


@st.composite
def divergent_plans(draw: Any, world: int) -> Plan:
    """Plans where ranks disagree: a collective skipped, a shape that differs, a rank that raises or dies.

    The model predicts whether each one hangs, errors or crashes, so these check the harness's deadline and
    diagnosis as much as torch.
    """
    shape = draw(mesh_shapes(world, max_dims=3, allow_smaller=False, allow_size_one=False))
    names = [f"d{i}" for i in range(len(shape))]
    steps_: list[Step] = [step("init_device_mesh", shape=shape, names=names, out="m")]
    rank = draw(st.integers(0, world - 1))
    dim = draw(st.sampled_from(names))
    kind = draw(st.sampled_from(["skip", "shape", "raise", "exit", "kill", "sleep", "order"]))
    if kind == "skip":
        steps_.append(step("all_reduce", mesh="m", dim=dim, skip_on=[rank]))
    elif kind == "shape" and len(shape) > 1:
        steps_.append(step("init_device_mesh", shape=list(reversed(shape)), names=names, out="n",
                           on_rank={rank: {"shape": [math.prod(shape)], "names": ["flat"]}}))
    elif kind in ("raise", "exit", "kill", "sleep"):
        steps_.append(draw(OPERATIONS[kind].draw(_Builder(world), None, None, False)))
    else:
        other = draw(st.sampled_from(names))
        steps_ += [step("all_reduce", mesh="m", dim=dim, skip_on=[rank]),
                   step("all_reduce", mesh="m", dim=other),
                   step("all_reduce", mesh="m", dim=dim, only_on=[rank])]
    steps_.append(step("check", mesh="m"))
    return Plan(tuple(steps_))

