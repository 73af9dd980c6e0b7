"""Collectives on a mesh dim or on a new_group handle: each with values that tell every rank apart."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from ..spec import fields as F
from ..spec.fields import PlanError
from ..spec.plan import step
from . import operation, rarely
from .meshes import names_of

ON = {"mesh": F.MESH, "dim": F.DIM, "group": F.GROUP}


def check_target(a: dict) -> None:
    if ("mesh" in a) == ("group" in a):
        raise PlanError("needs exactly one of 'mesh' (with 'dim') or 'group'")
    if "group" in a and "dim" in a:
        raise PlanError("'dim' goes with 'mesh', not with 'group'")


def model_group(run: Any, a: dict) -> Any:
    """The model's group the collective runs on (None: not a member of a new_group)."""
    if "group" in a:
        return run.resolve(a["group"])
    return run.model.get_group(run.mesh(a["mesh"]), a.get("dim"))


def torch_group(ex: Any, a: dict) -> tuple[Any, Any]:
    """torch's group and device for the collective; a non-member of a new_group gets a non-group object."""
    if "group" in a:
        return ex.resolve(a["group"]), ex.device
    mesh = ex.mesh(a["mesh"])
    dim = a.get("dim")
    ex.progress.context = (a["mesh"], dim)
    return mesh.get_group(dim), ex.device_of(mesh.device_type)


def on_model_group(run: Any, a: dict, call: Any) -> Any:
    """The model's side of a collective: `call(model, group)` on a member, None (nothing) on a non-member."""
    group = model_group(run, a)
    return None if group is None else call(run.model, group)


def on_torch_group(ex: Any, a: dict, call: Any) -> Any:
    """torch's side of a collective: `call(group, device)` on a member, None on a non-member."""
    group, device = torch_group(ex, a)
    return call(group, device) if is_member(group) else None


def is_member(group: Any) -> bool:
    import torch.distributed as dist

    return isinstance(group, dist.ProcessGroup)


@st.composite
def draw_target(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> dict:
    groups = [h for h, v in b.run.handles.items() if v is not None and not isinstance(v, list)
              and type(v).__name__ == "Group"]
    if groups and rarely(draw, 5):
        return {"group": draw(st.sampled_from(groups))}
    choices: list[Any] = list(range(mesh.ndim)) + [-1 - i for i in range(mesh.ndim)] + names_of(mesh)
    if mesh.ndim > 1 or draw(st.booleans()):
        return {"mesh": handle, "dim": draw(st.sampled_from(choices))}
    return {"mesh": handle}


@st.composite
def draw_rooted_target(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> dict:
    """A target and a source group rank within every group of it (a group handle may have one member)."""
    target = draw(draw_target(b, handle, mesh, allow_errors))
    smallest = 1 if "group" in target or not mesh.shape else min(mesh.shape)
    return dict(target, src=draw(st.integers(0, smallest - 1)))


@operation("all_reduce", "collective", {**ON, "numel": F.NUMEL})
class AllReduce:
    """all_reduce (sum) of a one-hot vector of length numel (default: the world), on a mesh dim or a group"""

    check_args = check_target

    def model(run: Any, a: dict) -> Any:
        return on_model_group(run, a, lambda model, group: model.all_reduce(group, a.get("numel", run.model.world)))

    def torch(ex: Any, a: dict) -> Any:
        return on_torch_group(ex, a, lambda group, device: ex.all_reduce(group, a.get("numel", ex.world), device))

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        numel = draw(st.sampled_from([b.world, b.world, 1, max(1, b.world // 2), b.world + 3]))
        return step("all_reduce", numel=numel, **draw(draw_target(b, handle, mesh, allow_errors)))


@operation("all_gather", "collective", dict(ON))
class AllGather:
    """all_gather of the rank: the group's members in group-rank order"""

    check_args = check_target

    def model(run: Any, a: dict) -> Any:
        return on_model_group(run, a, lambda model, group: model.all_gather(group))

    def torch(ex: Any, a: dict) -> Any:
        return on_torch_group(ex, a, lambda group, device: ex.all_gather(group, device))

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        return step("all_gather", **draw(draw_target(b, handle, mesh, allow_errors)))


@operation("broadcast", "collective", {**ON, "src": F.GROUP_RANK})
class Broadcast:
    """broadcast of the rank from group rank src (default 0)"""

    check_args = check_target

    def model(run: Any, a: dict) -> Any:
        return on_model_group(run, a, lambda model, group: model.broadcast(group, a.get("src", 0)))

    def torch(ex: Any, a: dict) -> Any:
        return on_torch_group(ex, a, lambda group, device: ex.broadcast(group, a.get("src", 0), device))

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        return step("broadcast", **draw(draw_rooted_target(b, handle, mesh, allow_errors)))


@operation("scatter", "collective", {**ON, "src": F.GROUP_RANK, "numel": F.NUMEL})
class Scatter:
    """scatter from group rank src (default 0) of one chunk of numel (default 1) per group rank, each chunk
    naming its sender and index"""

    check_args = check_target

    def model(run: Any, a: dict) -> Any:
        return on_model_group(run, a, lambda model, group: model.scatter(group, a.get("src", 0), a.get("numel", 1)))

    def torch(ex: Any, a: dict) -> Any:
        return on_torch_group(ex, a,
                               lambda group, device: ex.scatter(group, a.get("src", 0), a.get("numel", 1), device))

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        rooted = draw(draw_rooted_target(b, handle, mesh, allow_errors))
        return step("scatter", numel=draw(st.sampled_from([1, 3])), **rooted)


@operation("reduce_scatter", "collective", {**ON, "numel": F.NUMEL})
class ReduceScatter:
    """reduce_scatter_tensor (sum) of group size x numel (default 1) values per rank, each weighted by the
    sender's rank + 1, so every chunk tells which ranks were summed"""

    check_args = check_target

    def model(run: Any, a: dict) -> Any:
        return on_model_group(run, a, lambda model, group: model.reduce_scatter(group, a.get("numel", 1)))

    def torch(ex: Any, a: dict) -> Any:
        return on_torch_group(ex, a, lambda group, device: ex.reduce_scatter(group, a.get("numel", 1), device))

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        return step("reduce_scatter", numel=draw(st.sampled_from([1, 2])),
                    **draw(draw_target(b, handle, mesh, allow_errors)))


@operation("barrier", "collective", dict(ON))
class Barrier:
    """barrier on a mesh dim or a group"""

    check_args = check_target

    def model(run: Any, a: dict) -> Any:
        return on_model_group(run, a, lambda model, group: model.barrier(group))

    def torch(ex: Any, a: dict) -> Any:
        import torch.distributed as dist

        on_torch_group(ex, a, lambda group, device: dist.barrier(group=group))
        return None

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        return step("barrier", **draw(draw_target(b, handle, mesh, allow_errors)))
