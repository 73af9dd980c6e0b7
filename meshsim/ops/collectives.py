"""Collectives on a mesh dim or on a new_group handle: each with values that tell every rank apart."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from ..model.expect import Err, ModelRaise, quirk
from ..spec import fields as F
from ..spec.fields import PlanError
from ..spec.plan import step
from .meshes import names_of
from .registry import operation, rarely

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
    if group is None:
        return None
    run.model.context = (a["mesh"], a.get("dim")) if "mesh" in a else None
    try:
        return call(run.model, group)
    finally:
        run.model.context = None


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


# Each collective's two sides: what the model expects on a group (recording the blocking call, so the model sees a
# hang where members disagree), and what torch returns. `check` runs the same three along every mesh dim.


def all_reduce_expected(model: Any, group: Any, numel: int) -> Any:
    model.collective("all_reduce", group, (numel,))
    return sorted(r for r in group.ranks if r < numel)  # the indexes set to 1: the members, ascending


def all_reduce_performed(ex: Any, group: Any, device: Any, numel: int) -> Any:
    """A one-hot vector at this rank's index: the sum names exactly the members."""
    import torch
    import torch.distributed as dist

    x = torch.zeros(numel, device=device)
    if ex.rank < numel:
        x[ex.rank] = 1
    dist.all_reduce(x, group=group)
    return ex.moved(lambda: one_hot_members(x.tolist()))


def one_hot_members(values: list[float]) -> list[Any]:
    """The sum of one-hot vectors as the indexes that are 1 (every value, if some are neither 0 nor 1)."""
    if all(v in (0.0, 1.0) for v in values):
        return [i for i, v in enumerate(values) if v == 1.0]
    return values


def all_gather_expected(model: Any, group: Any) -> Any:
    model.collective("all_gather", group)
    model.note_order(group)
    return quirk(list(group.order), list(group.ranks), "group-rank-order")


def all_gather_performed(ex: Any, group: Any, device: Any) -> Any:
    import torch
    import torch.distributed as dist

    out = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, torch.tensor([ex.rank], device=device), group=group)
    return ex.moved(lambda: [int(t.item()) for t in out])


def broadcast_expected(model: Any, group: Any, src: int) -> Any:
    if not 0 <= src < len(group.ranks):
        # dist.broadcast lets an out-of-range group_src through to the backend, which refuses it.
        raise ModelRaise(Err("RuntimeError", "invalid root rank"))
    model.collective("broadcast", group, (src,))
    model.note_order(group)
    return quirk(group.order[src], group.ranks[src], "group-rank-order")


def broadcast_performed(ex: Any, group: Any, device: Any, src: int) -> Any:
    import torch
    import torch.distributed as dist

    t = torch.tensor([ex.rank], device=device)
    dist.broadcast(t, group=group, group_src=src)
    return ex.moved(lambda: int(t.item()))


def scatter_chunk(src_rank: int, index: int, numel: int) -> list[int]:
    """What scatter's chunk `index` holds: values that name the sender and the chunk."""
    return [src_rank * 1_000_000 + index * 1_000 + j for j in range(numel)]


def scatter_expected(model: Any, group: Any, src: int, numel: int) -> Any:
    if not 0 <= src < len(group.ranks):
        raise ModelRaise(Err("RuntimeError", "invalid root rank"))
    model.collective("scatter", group, (src, numel))
    return scatter_chunk(group.ranks[src], group.group_rank(model.rank), numel)


def scatter_performed(ex: Any, group: Any, device: Any, src: int, numel: int) -> Any:
    import torch
    import torch.distributed as dist

    chunks = None
    if dist.get_rank(group) == src:
        chunks = [torch.tensor(scatter_chunk(ex.rank, i, numel), dtype=torch.int64, device=device)
                  for i in range(dist.get_world_size(group))]
    out = torch.zeros(numel, dtype=torch.int64, device=device)
    dist.scatter(out, chunks, group=group, group_src=src)
    return ex.moved(out.tolist)


def reduce_scatter_expected(model: Any, group: Any, numel: int) -> Any:
    """Every member sends (its rank + 1) * position; chunk i is summed on group rank i."""
    model.collective("reduce_scatter", group, (numel,))
    weight = sum(r + 1 for r in group.ranks)
    start = group.group_rank(model.rank) * numel
    return [weight * (start + j + 1) for j in range(numel)]


def reduce_scatter_performed(ex: Any, group: Any, device: Any, numel: int) -> Any:
    import torch
    import torch.distributed as dist

    size = dist.get_world_size(group)
    x = torch.arange(1, size * numel + 1, dtype=torch.int64, device=device) * (ex.rank + 1)
    out = torch.zeros(numel, dtype=torch.int64, device=device)
    dist.reduce_scatter_tensor(out, x, group=group)
    return ex.moved(out.tolist)


# --------------------------------------------------------------------------------------------- the operations


@operation("all_reduce", "collective", {**ON, "numel": F.NUMEL}, weight=1)
class AllReduce:
    """all_reduce (sum) of a one-hot vector of length numel (default: the world), on a mesh dim or a group"""

    check_args = check_target

    def model(run: Any, a: dict) -> Any:
        return on_model_group(run, a, lambda model, group: all_reduce_expected(model, group,
                                                                               a.get("numel", model.world)))

    def torch(ex: Any, a: dict) -> Any:
        return on_torch_group(ex, a, lambda group, device: all_reduce_performed(ex, group, device,
                                                                                a.get("numel", ex.world)))

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        numel = draw(st.sampled_from([b.world, b.world, 1, max(1, b.world // 2), b.world + 3]))
        return step("all_reduce", numel=numel, **draw(draw_target(b, handle, mesh, allow_errors)))


@operation("all_gather", "collective", dict(ON), weight=1)
class AllGather:
    """all_gather of the rank: the group's members in group-rank order"""

    check_args = check_target

    def model(run: Any, a: dict) -> Any:
        return on_model_group(run, a, all_gather_expected)

    def torch(ex: Any, a: dict) -> Any:
        return on_torch_group(ex, a, lambda group, device: all_gather_performed(ex, group, device))

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        return step("all_gather", **draw(draw_target(b, handle, mesh, allow_errors)))


@operation("broadcast", "collective", {**ON, "src": F.GROUP_RANK}, weight=1)
class Broadcast:
    """broadcast of the rank from group rank src (default 0)"""

    check_args = check_target

    def model(run: Any, a: dict) -> Any:
        return on_model_group(run, a, lambda model, group: broadcast_expected(model, group, a.get("src", 0)))

    def torch(ex: Any, a: dict) -> Any:
        return on_torch_group(ex, a, lambda group, device: broadcast_performed(ex, group, device, a.get("src", 0)))

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        return step("broadcast", **draw(draw_rooted_target(b, handle, mesh, allow_errors)))


@operation("scatter", "collective", {**ON, "src": F.GROUP_RANK, "numel": F.NUMEL}, weight=1)
class Scatter:
    """scatter from group rank src (default 0) of one chunk of numel (default 1) per group rank, each chunk
    naming its sender and index"""

    check_args = check_target

    def model(run: Any, a: dict) -> Any:
        return on_model_group(run, a, lambda model, group: scatter_expected(model, group, a.get("src", 0),
                                                                            a.get("numel", 1)))

    def torch(ex: Any, a: dict) -> Any:
        return on_torch_group(ex, a, lambda group, device: scatter_performed(ex, group, device, a.get("src", 0),
                                                                             a.get("numel", 1)))

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        rooted = draw(draw_rooted_target(b, handle, mesh, allow_errors))
        return step("scatter", numel=draw(st.sampled_from([1, 3])), **rooted)


@operation("reduce_scatter", "collective", {**ON, "numel": F.NUMEL}, weight=1)
class ReduceScatter:
    """reduce_scatter_tensor (sum) of group size x numel (default 1) values per rank, each weighted by the
    sender's rank + 1, so every chunk tells which ranks were summed"""

    check_args = check_target

    def model(run: Any, a: dict) -> Any:
        return on_model_group(run, a, lambda model, group: reduce_scatter_expected(model, group, a.get("numel", 1)))

    def torch(ex: Any, a: dict) -> Any:
        return on_torch_group(ex, a, lambda group, device: reduce_scatter_performed(ex, group, device,
                                                                                    a.get("numel", 1)))

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        return step("reduce_scatter", numel=draw(st.sampled_from([1, 2])),
                    **draw(draw_target(b, handle, mesh, allow_errors)))


@operation("barrier", "collective", dict(ON), weight=1)
class Barrier:
    """barrier on a mesh dim or a group"""

    check_args = check_target

    def model(run: Any, a: dict) -> Any:
        return on_model_group(run, a, lambda model, group: model.collective("barrier", group))

    def torch(ex: Any, a: dict) -> Any:
        import torch.distributed as dist

        on_torch_group(ex, a, lambda group, device: dist.barrier(group=group))
        return None

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        return step("barrier", **draw(draw_target(b, handle, mesh, allow_errors)))
