"""DTensor on any mesh the plan language builds: distribute, redistribute, full_tensor, to_local, from_local and
a sum over a tensor dim, each observed rank by rank (local shape, global offset, values) against
meshsim.model.dtensor, which simulates the whole mesh. Each step's model side (the simulation over the mesh
and the collectives it issues) is meshsim.ops.dtensor_model's; each operation's torch side and draw are here.

Values tell every element apart (a global tensor holds 0, 1, 2, ...), and from_local's fresh blocks tell every
rank apart too (rank r adds 4096 * 2**r), so a Partial reduced over the wrong mesh dim shows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st

from ..core.wire import RUN_CHECK_CALL, local_observation
from ..model.expect import Err, ModelRaise, Quirk
from ..spec import fields as F
from ..spec.placements import (
    MAX_DTENSOR_NUMEL,
    REDUCE_OPS,
    contiguous_strides,
    parse_placement,
    placement_text,
)
from ..spec.plan import step
from .dtensor_model import (
    _calls,
    _derive,
    _dtensor,
    _geometry,
    _groups_needed,
    check_redistribute_target,
    global_shape,
    model_distribute,
    model_redistribute,
    placements_of,
    plain_observation,
    rank_weight,
    src_data_rank,
)
from .registry import holds, operation, rarely

if TYPE_CHECKING:
    from ..model import dtensor as D
else:
    from .dtensor_model import D  # meshsim.model.dtensor, imported on first use

DT = F.PRODUCES_DTENSOR


# --------------------------------------------------------------------------------------------- torch's side


def torch_observe(ex: Any, dt: Any) -> dict:
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local = dt.to_local()
    _, offset = compute_local_shape_and_global_offset(dt.shape, dt.device_mesh, dt.placements)
    return local_observation(local.shape, ex.values_of(local), offset, [torch_placement_text(p) for p in dt.placements],
                             dt.shape)


def torch_placement_text(placement: Any) -> str:
    """A torch placement as the plan language writes it: "P(max)" (torch < 2.10 prints a Partial as "P")."""
    reduce_op = getattr(placement, "reduce_op", None) if placement.is_partial() else None
    return f"P({reduce_op})" if reduce_op is not None else str(placement)


def torch_plain_tensor(ex: Any, tensor: Any) -> dict:
    return {"shape": list(tensor.shape), "values": ex.values_of(tensor), "contiguous": tensor.is_contiguous()}


def torch_placements(texts: list[str], ndim: int) -> list[Any]:
    from torch.distributed.tensor import Partial, Replicate, Shard

    out = []
    for p in (parse_placement(t) for t in texts):
        out.append(Replicate() if p[0] == "R" else Shard(p[1]) if p[0] == "S" else Partial(p[1]))
    return out


def torch_dtensor(ex: Any, ref: str) -> Any:
    from torch.distributed.tensor import DTensor

    value = ex.resolve(ref)
    if not isinstance(value, DTensor):
        raise ex.HandleError(f"handle {ref!r} is not a DTensor")
    return value


def torch_block(ex: Any, shape: list[int], mesh: Any, base: float = 0.0) -> Any:
    import torch

    numel = math.prod(shape)
    device = ex.device_of(mesh.device_type)
    return (torch.arange(numel, dtype=torch.float64, device=device) + base).reshape(shape)


# --------------------------------------------------------------------------------------------- generator helpers


def dtensors(b: Any) -> list[tuple[str, D.DTensorModel]]:
    return [(h, v) for h, v in b.run.handles.items() if isinstance(v, D.DTensorModel)]


@st.composite
def tensor_shapes(draw: Any, mesh_shape: tuple[int, ...], platform: Any) -> list[int]:
    """Shapes that rarely divide the mesh: sizes 0 and 1, primes, a mesh dim's size plus one (no 0 where the
    release's padding of a size-0 dim fails on some ranks only: a hang, rule pad-empty-dims)."""
    sizes = sorted({least_size(platform), 1, 2, 3, 5, 7} | {s + 1 for s in mesh_shape} | set(mesh_shape))
    return within_numel(draw(st.lists(st.sampled_from(sizes), min_size=1, max_size=3)))


def least_size(platform: Any) -> int:
    """The least size a drawn tensor dim takes on this release (see tensor_shapes)."""
    return 0 if holds("pad-empty-dims", platform) else 1


def within_numel(shape: list[int]) -> list[int]:
    """A drawn shape cut to what a plan may hold (a large mesh's sizes, several of them): its largest sizes
    become 1."""
    while math.prod(shape) > MAX_DTENSOR_NUMEL:
        shape[shape.index(max(shape))] = 1
    return shape


@st.composite
def placement_lists(draw: Any, mesh_ndim: int, tensor_ndim: int, partial: bool = True) -> list[str]:
    """One placement per mesh dim: Shard on any tensor dim (the same one on two mesh dims included; negative
    now and then), Replicate, and Partial with one reduce op for the whole list."""
    op = draw(st.sampled_from(REDUCE_OPS))
    out = []
    for _ in range(mesh_ndim):
        kind = draw(st.sampled_from(["S", "S", "R"] + (["P"] if partial else [])))
        if kind == "S":
            dim = draw(st.integers(0, tensor_ndim - 1))
            out.append(f"S({dim - tensor_ndim if rarely(draw, 6) else dim})")
        else:
            out.append("R" if kind == "R" else f"P({op})")
    return out


@st.composite
def redistribute_targets(draw: Any, dt: D.DTensorModel, allow_errors: bool) -> list[str]:
    """Shard or Replicate per mesh dim; a pending Partial is kept or reduced (rarely: turned into another
    Partial, which torch refuses)."""
    target = draw(placement_lists(dt.mesh.ndim, len(dt.shape), partial=False)) if dt.shape else ["R"] * len(
        dt.placements)
    for i, p in enumerate(dt.placements):
        if p[0] == "P" and draw(st.booleans()):
            other = [o for o in REDUCE_OPS if o != p[1]][0]
            target[i] = f"P({other})" if allow_errors and rarely(draw, 10) else placement_text(p)
    return target


def reading(op: str) -> Any:
    """The draw of a step that only reads a held DTensor (full_tensor, to_local)."""

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        held = dtensors(b)
        return step(op, tensor=draw(st.sampled_from(held))[0]) if held else None

    return draw


def usable(mesh: Any) -> bool:
    return mesh.backend_ready and mesh.creation_quirk is None and isinstance(mesh.view, list) and mesh.ndim >= 1


# --------------------------------------------------------------------------------------------- the operations


@operation("distribute", "dtensor", {"mesh": F.MESH, "shape": F.TENSOR_SHAPE, "placements": F.PLACEMENTS,
                                    "src_data_rank": F.SRC_DATA_RANK, "mesh_from": F.MESH_FROM, "within": F.MESH},
           required=("mesh", "shape", "placements"), produces=DT, weight=2)
class Distribute:
    """distribute_tensor of a global tensor (float64) with one placement per mesh dim: each rank passes one that
    holds 4096 * 2**rank + 0, 1, 2, ... (which rank's data torch sends shows); `src_data_rank`: the group rank whose
    data each dim scatters or broadcasts (default 0), "none" for each rank's own; `mesh_from`, `within`: see
    with_mesh; observes the rank's local shape, values and global offset"""

    @staticmethod
    def check_args(a: dict) -> None:
        check_mesh_source(a)

    def model(run: Any, a: dict) -> Any:
        mesh_given(run, a)
        return model_distribute(run, a)

    def torch(ex: Any, a: dict) -> Any:
        from torch.distributed.tensor import distribute_tensor

        mesh = ex.mesh(a["mesh"])
        tensor = torch_block(ex, a["shape"], mesh, rank_weight(ex.rank))
        kwargs = {"src_data_rank": src_data_rank(a)} if "src_data_rank" in a else {}
        placements = torch_placements(a["placements"], len(a["shape"]))
        return with_mesh(ex, mesh, a, lambda given: distribute_tensor(tensor, given, placements, **kwargs))

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        if not usable(mesh):
            return None
        shape = draw(tensor_shapes(mesh.shape, b.platform))
        placements = draw(placement_lists(mesh.ndim, len(shape)))
        if allow_errors and rarely(draw, 20):  # refused: one placement too many, or a dim the tensor lacks
            # past the end, or before the front where the release refuses that on every rank (2.9 took it)
            lacks = draw(st.sampled_from([len(shape), -len(shape) - 1] if holds("shard-dim-normalized", b.platform)
                                         else [len(shape)]))
            placements = placements + ["R"] if draw(st.booleans()) else placements[:-1] + [f"S({lacks})"]
        extra = {}
        if rarely(draw, 3):  # another source than each group's first member, or none
            extra["src_data_rank"] = draw(st.sampled_from(["none", *range(min(mesh.shape))]))
        extra.update(draw(mesh_sources(allow_errors)))
        return step("distribute", mesh=handle, shape=shape, placements=placements, out=b.fresh("t"), **extra)


@operation("redistribute", "dtensor", {"tensor": F.DTENSOR, "placements": F.PLACEMENTS, "async_op": F.BOOL},
           required=("tensor", "placements"), produces=DT, weight=2)
class Redistribute:
    """DTensor.redistribute to other placements (to Partial only where it already is: torch refuses the rest);
    `async_op`: the collectives return at once, and the values are waited for where they are read"""

    def model(run: Any, a: dict) -> Any:
        dt = _dtensor(run, a["tensor"])
        target = placements_of(a, len(dt.shape))
        check_redistribute_target(run, dt, target)
        return model_redistribute(run, dt, target)

    def torch(ex: Any, a: dict) -> Any:
        dt = torch_dtensor(ex, a["tensor"])
        kwargs = {"async_op": True} if a.get("async_op") else {}
        return dt.redistribute(dt.device_mesh, torch_placements(a["placements"], dt.ndim), **kwargs)

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        held = dtensors(b)
        if not held:
            return None
        ref, dt = draw(st.sampled_from(held))
        extra = {"async_op": True} if rarely(draw, 4) else {}
        return step("redistribute", tensor=ref, placements=draw(redistribute_targets(dt, allow_errors)),
                    out=b.fresh("t"), **extra)


@operation("full_tensor", "dtensor", {"tensor": F.DTENSOR}, required=("tensor",), weight=1)
class FullTensor:
    """DTensor.full_tensor(): every rank observes the whole tensor's shape, values and whether it is contiguous"""

    def model(run: Any, a: dict) -> Any:
        dt = _dtensor(run, a["tensor"])
        whole = model_redistribute(run, dt, [("R",)] * len(dt.placements), "full_tensor")
        # (before 2.13 an uneven gather's unpadding left a view: gather-unpad-copies)
        gathered = holds("gather-unpad-copies", dt.mesh.platform) and any(
            p[0] != "R" and n > 1 for p, n in zip(dt.placements, dt.mesh.shape))
        return plain_observation(whole, run.model.rank, whole=True, gathered=gathered)

    def torch(ex: Any, a: dict) -> Any:
        return torch_plain_tensor(ex, torch_dtensor(ex, a["tensor"]).full_tensor())

    draw = reading("full_tensor")


@operation("to_local", "dtensor", {"tensor": F.DTENSOR}, required=("tensor",), weight=1)
class ToLocal:
    """DTensor.to_local(): the rank's block, its shape, values and whether it is contiguous"""

    def model(run: Any, a: dict) -> Any:
        return plain_observation(_dtensor(run, a["tensor"]), run.model.rank, whole=False)

    def torch(ex: Any, a: dict) -> Any:
        return torch_plain_tensor(ex, torch_dtensor(ex, a["tensor"]).to_local())

    draw = reading("to_local")


@operation("from_local", "dtensor",
           {"mesh": F.MESH, "tensor": F.DTENSOR, "local_shape": F.TENSOR_SHAPE, "placements": F.PLACEMENTS,
            "run_check": F.BOOL, "shape": F.TENSOR_SHAPE, "stride": F.TENSOR_SHAPE, "mesh_from": F.MESH_FROM,
            "within": F.MESH},
           required=("mesh", "placements"), produces=DT, weight=1)
class FromLocal:
    """DTensor.from_local of this rank's block: `tensor`'s local block, or a fresh `local_shape` block holding
    4096 * 2**rank + 0, 1, 2, ... (values that tell ranks apart); `shape` passes the global shape (and its
    contiguous stride), else torch infers it as if shards were even; `stride` alone passes a global stride
    without a shape (torch refuses the one without the other); `run_check` broadcasts Replicate dims;
    `mesh_from`, `within`: see with_mesh"""

    @staticmethod
    def check_args(a: dict) -> None:
        if ("tensor" in a) == ("local_shape" in a):
            raise F.PlanError("needs exactly one of 'tensor' (a DTensor whose block to take) or 'local_shape'")
        if "stride" in a and "shape" in a:
            raise F.PlanError("'shape' passes its own contiguous stride: 'stride' is for a stride without a shape")
        check_mesh_source(a)

    def model(run: Any, a: dict) -> Any:
        mesh_given(run, a)
        mesh = run.mesh(a["mesh"])
        source = _dtensor(run, a["tensor"]) if "tensor" in a else None
        geo = _geometry(mesh)
        given = _from_local_inputs(run, source, a, geo)
        mine = given.right[run.model.rank]
        placements = placements_of(a, len(mine.shape))
        D.check_placements(placements, mesh.ndim, _sharded_ndim(a, mine, geo),
                           holds("mixed-partials-refused", run.model.platform))
        if "stride" in a:  # (before the rank's membership counts: every rank refuses it)
            raise ModelRaise(Err("RuntimeError", "Please pass both shape and stride at the same time"))
        shape = tuple(a["shape"]) if "shape" in a else global_shape(mine.shape, placements, mesh.shape)
        if geo is None:
            return _derive(None, mesh, None, shape, placements, None)
        if a.get("run_check"):
            run_check_metadata(run, given, check_shape="shape" not in a)
        checked = [d for d, p in enumerate(placements) if p[0] == "R"] if a.get("run_check") else []
        if checked:
            _groups_needed(mesh)
        # each Replicate dim broadcasts the whole block: members holding blocks of other sizes are a mismatch
        _calls(run, mesh, [(d, "broadcast_") for d in checked], "from_local check", ("sizes", mine.shape))

        def sim(g: D.Geometry, blocks: D.Blocks, order: Any, _: Any) -> D.Blocks:
            out = {r: D.made_contiguous(b) for r, b in blocks.items()} if checked else dict(blocks)
            for d in checked:
                out = {r: out[order(g, r, d)[0]] for r in g.flat}
            return out

        key = ("from_local", shape, tuple(placements), tuple(checked))
        made = _derive(given, mesh, geo, shape, placements, sim, key)
        made.beliefs = _beliefs(run, a, given.torch or given.right, placements, tuple(mesh.shape))
        return made

    def torch(ex: Any, a: dict) -> Any:
        from torch.distributed.tensor import DTensor

        mesh = ex.mesh(a["mesh"])
        if "tensor" in a:
            local = torch_dtensor(ex, a["tensor"]).to_local()
        else:
            local = torch_block(ex, a["local_shape"], mesh, rank_weight(ex.rank))
        kwargs: dict = {}
        if "shape" in a:
            import torch

            kwargs = {"shape": torch.Size(a["shape"]), "stride": contiguous_strides(a["shape"])}
        elif "stride" in a:
            kwargs = {"stride": tuple(a["stride"])}
        placements = torch_placements(a["placements"], local.ndim)
        return with_mesh(ex, mesh, a, lambda given: DTensor.from_local(local, given, placements,
                                                                   run_check=a.get("run_check", False), **kwargs))

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        if not usable(mesh):
            return None
        own = [(h, dt) for h, dt in dtensors(b) if dt.mesh is mesh]
        # run_check on a mesh that leaves ranks out hangs (finding from-local-run-check-world, a scenario shows
        # it): a sweep that drew it would spend a deadline per plan on a known answer.
        run_check = math.prod(mesh.root_mesh.shape) == b.world and draw(st.booleans())
        if own and draw(st.booleans()):
            ref, dt = draw(st.sampled_from(own))
            placements = [placement_text(p) for p in dt.placements]
            extra = {"shape": list(dt.shape)} if draw(st.booleans()) else _stride_alone(draw, dt.shape, allow_errors)
            return step("from_local", mesh=handle, tensor=ref, placements=placements, run_check=run_check,
                        out=b.fresh("t"), **extra, **draw(mesh_sources(allow_errors)))
        local_shape = draw(st.lists(st.integers(least_size(b.platform), 3), min_size=1, max_size=2))
        placements = draw(placement_lists(mesh.ndim, len(local_shape)))
        extra = _stride_alone(draw, local_shape, allow_errors)
        return step("from_local", mesh=handle, local_shape=local_shape, placements=placements, run_check=run_check,
                    out=b.fresh("t"), **extra, **draw(mesh_sources(allow_errors)))


def _stride_alone(draw: Any, shape: Any, allow_errors: bool) -> dict:
    """Now and then the refused request: a global stride without its shape."""
    return {"stride": list(contiguous_strides(shape))} if allow_errors and rarely(draw, 5) else {}


def check_mesh_source(a: dict) -> None:
    if a.get("mesh_from") == "none" and "within" in a:
        raise F.PlanError("'within' makes a current mesh: 'mesh_from' = \"none\" needs none")


def mesh_given(run: Any, a: dict) -> None:
    """A DTensor call that passes no mesh outside any `with mesh:` is refused before anything else (torch's
    `device_mesh or _mesh_resources.get_current_mesh()`)."""
    if "within" in a:
        run.mesh(a["within"])
    if a.get("mesh_from") == "none":
        raise ModelRaise(Err("RuntimeError", "No device mesh is currently active"))


def with_mesh(ex: Any, mesh: Any, a: dict, call: Any) -> Any:
    """call(mesh) (mesh_from "argument", the default); call(None) inside `with mesh:`, so that DTensor's API takes
    the current mesh ("context"); call(None) outside any ("none"). `within`: a mesh entered around all of it, so
    the stack holds two (the argument, or the innermost, must still win)."""
    how = a.get("mesh_from", "argument")
    with ex.mesh(a["within"]) if "within" in a else contextlib.nullcontext():
        if how == "argument":
            return call(mesh)
        if how == "none":
            return call(None)
        with mesh:
            return call(None)


@st.composite
def mesh_sources(draw: Any, allow_errors: bool) -> dict:
    """Now and then the mesh from `with mesh:` rather than an argument; rarely none at all (torch refuses)."""
    if not rarely(draw, 6):
        return {}
    return {"mesh_from": draw(st.sampled_from(["context", "context", "none"] if allow_errors else ["context"]))}


def _sharded_ndim(a: dict, mine: Any, geo: Any) -> int | None:
    """The ndim from_local checks Shard dims against (measured, torch 2.13): without `shape`, the local block's,
    on every rank, members or not (torch infers the global shape first); with `shape`, torch trusts the caller:
    a member's DTensor is checked against the shape it claims, a rank outside the mesh is not checked at all."""
    if "shape" not in a:
        return len(mine.shape)
    return None if geo is None else len(a["shape"])


def _beliefs(run: Any, a: dict, blocks: D.Blocks, placements: list[tuple], mesh_shape: tuple[int, ...]
             ) -> dict[int, tuple] | None:
    """The global shape each member holds (given, or inferred from its own block), where members differ."""
    beliefs = {}
    for r, block in blocks.items():
        theirs = run.args_of(r, a)
        beliefs[r] = tuple(theirs["shape"]) if "shape" in theirs else global_shape(block.shape, placements, mesh_shape)
    return beliefs if len(set(beliefs.values())) > 1 else None


def run_check_metadata(run: Any, given: D.DTensorModel, check_shape: bool) -> None:
    """check_tensor_meta: all_gather_object of every rank's dtype (and shape and stride when from_local infers
    the global shape) over the default group, not the mesh; ValueError where they differ."""
    run.model.collective(RUN_CHECK_CALL, run.model.world_group)
    if not check_shape:
        return
    metas: set[Any]
    if given.simulated:
        metas = {(b.shape, b.strides or contiguous_strides(b.shape)) for b in given.right.values()}
    else:  # the members' blocks are the source's local shards (fresh blocks all have one shape)
        metas = {tuple(row) for row in given.mesh_shapes()} if given.shape else {()}
    if len(metas) > 1:
        raise ModelRaise(Err("ValueError", "Inconsistent tensor metadata"))


def _from_local_inputs(run: Any, source: D.DTensorModel | None, a: dict, geo: D.Geometry | D.Unsimulated | None
                       ) -> D.DTensorModel:
    """The blocks from_local receives on every member (this rank alone outside the mesh), as they should be and
    as torch holds them: a fresh block per rank, or `source`'s local blocks."""
    mesh = run.mesh(a["mesh"])
    if isinstance(geo, D.Unsimulated):  # this rank's block's shape alone; the members' shapes where it matters
        if source is None:
            return D.DTensorModel(mesh, geo, (), [], {run.model.rank: D.Block(tuple(a["local_shape"]), ())}, None)
        # the source's local block, placed on the source's mesh (from_local may take it onto another mesh)
        mine = (D.local_shape_and_offset(source.shape, source.placements, source.mesh.coordinate,
                                         source.mesh.shape)[0]
                if source.geometry is not None else D.empty_block().shape)
        return D.DTensorModel(mesh, geo, source.shape, source.placements, {run.model.rank: D.Block(tuple(mine), ())},
                              None)
    ranks = tuple(geo.flat if geo is not None else [run.model.rank])
    torch: D.Blocks | None
    if source is None:  # each member's own local_shape (on_rank may give one its own)
        shapes = tuple(tuple(run.args_of(r, a)["local_shape"]) for r in ranks)
        right = torch = D.shared_sim(("fresh blocks", ranks, shapes), (), lambda: {
            r: D.arange_block(shape, rank_weight(r)) for r, shape in zip(ranks, shapes)})
    else:
        right, torch = D.shared_sim(("blocks of", ranks), (source.right, source.torch), lambda: source.map_sides(
            lambda state: {r: state.get(r, D.empty_block()) for r in ranks}))
    return D.DTensorModel(mesh, geo, (), [], right, torch)


@operation("sum", "dtensor", {"tensor": F.DTENSOR, "dim": F.TENSOR_DIM}, required=("tensor", "dim"),
           produces=DT, weight=1)
class Sum:
    """torch.sum over one tensor dim of a DTensor: a dim sharded on a mesh dim becomes Partial(sum) there (a
    Partial(sum) input stays so; a Partial(avg|max|min) input is first reduced, with the summed dim's shards)"""

    chooses = "placements"  # the sharding strategy's (2.14 keeps shards that 2.13 replicated): torch's choice

    def model(run: Any, a: dict) -> Any:
        dt = _dtensor(run, a["tensor"])
        ndim = len(dt.shape)
        dim = a["dim"] + ndim if a["dim"] < 0 else a["dim"]
        if not 0 <= dim < ndim:
            raise ModelRaise(Err("IndexError", "Dimension out of range"))
        # torch's choice is its members': a rank outside the mesh may price the strategies otherwise (model.choices)
        needed = _input_for(dt.placements, run.chosen.get(run.index), dim) if dt.geometry is not None else None
        if needed is not None:  # torch chose these output placements: its input was redistributed to `needed`
            return _summed(run, model_redistribute(run, dt, needed, "sum"), dim)
        if any(p[0] == "P" and p[1] != "sum" for p in dt.placements):
            # sum is not linear over such a Partial: torch's reduction strategy first replicates every Partial dim
            # and every Shard of the summed dim (replicate_reduction_dims), then sums locally
            needed = [("R",) if p[0] == "P" or p == ("S", dim) else p for p in dt.placements]
            if ":" in dt.mesh.device:  # the strategy prices that redistribution: torch fails on every rank
                _priced_on_indexed_device(run, _summed(run, model_redistribute(run, dt, needed, "sum"), dim))
            dt = model_redistribute(run, dt, needed, "sum")
            if not holds("sum-reduces-other-partials", run.model.platform):  # torch < 2.10 sums the partials
                run.findings.add(SUM_OVER_PARTIALS)
                return dataclasses.replace(_summed(run, dt, dim), torch=None, finding=SUM_OVER_PARTIALS)
        if ":" in dt.mesh.device and dt.geometry is not None and dt.placements != [("R",)] * len(dt.placements) \
                and holds("sum-prices-every-strategy", run.model.platform):
            _priced_on_indexed_device(run, _summed(run, dt, dim))  # a Shard, a Partial(sum): its members fail
        return _summed(run, dt, dim)

    def torch(ex: Any, a: dict) -> Any:
        import torch

        return torch.sum(torch_dtensor(ex, a["tensor"]), dim=a["dim"])

    @st.composite
    def draw(draw: Any, b: Any, handle: str, mesh: Any, allow_errors: bool) -> Any:
        held = [(h, dt) for h, dt in dtensors(b) if dt.shape]
        if not held:
            return None
        ref, dt = held[-1] if draw(st.booleans()) else draw(st.sampled_from(held))  # often the newest
        return step("sum", tensor=ref, dim=draw(st.integers(0, len(dt.shape) - 1)), out=b.fresh("t"))


SUM_OVER_PARTIALS = "dtensor-sum-linear-over-other-partials"


def _priced_on_indexed_device(run: Any, right: D.DTensorModel) -> None:
    """torch fails where a sum's strategy prices a move on a mesh of device type "cpu:0"; `right` is what it
    should give (finding dtensor-indexed-device-type)."""
    right_only = dataclasses.replace(right, torch=right.right).observation(run.model.rank)
    said = "device_count" if holds("sharding-errors-unwrapped", run.model.platform) else "Sharding propagation failed"
    raise ModelRaise(Quirk(right_only, Err("RuntimeError", said), D.INDEXED_DEVICE))


def _summed(run: Any, dt: D.DTensorModel, dim: int) -> D.DTensorModel:
    """The sum over `dim` of a DTensor that needs no more communication for it."""
    placements = [_after_sum(p, dim) for p in dt.placements]
    shape = dt.shape[:dim] + dt.shape[dim + 1:]
    if dt.geometry is None:  # outside the mesh DTensor's dispatch makes a default local: zeros(()) or []
        local = {run.model.rank: D.Block((), (0.0,)) if not shape else D.empty_block()}
        return D.DTensorModel(dt.mesh, None, shape, placements, local, local)
    state, torch = dt.map_sides(lambda blocks: {r: D.sum_dim(block, dim) for r, block in blocks.items()})
    beliefs = {r: b[:dim] + b[dim + 1:] for r, b in dt.beliefs.items()} if dt.beliefs else None
    return D.DTensorModel(dt.mesh, dt.geometry, shape, placements, state, torch, dt.finding, beliefs)


def _input_for(current: list[tuple], chosen: Any, dim: int) -> list[tuple] | None:
    """The input placements a sum over `dim` needs for the output placements torch chose (a sharding strategy's
    rules, mesh dim by mesh dim: Partial(sum) from a Shard of `dim` or a Partial(sum), a Shard from the Shard of
    the same tensor dim, Replicate from Replicate); None when torch chose nothing here, or nothing a sum can
    make (that stays a difference)."""
    if not isinstance(chosen, list) or len(chosen) != len(current):
        return None
    needed: list[tuple] = []
    for now, text in zip(current, chosen):
        out = parse_placement(text) if isinstance(text, str) else None
        if out == ("P", "sum"):
            needed.append(now if now in (("S", dim), ("P", "sum")) else ("S", dim))
        elif out is not None and out[0] == "S":
            needed.append(("S", out[1] if out[1] < dim else out[1] + 1))
        elif out == ("R",):
            needed.append(("R",))
        else:
            return None
    return needed


def _after_sum(p: tuple, dim: int) -> tuple:
    if p[0] == "S" and p[1] == dim:
        return ("P", "sum")
    if p[0] == "S" and p[1] > dim:
        return ("S", p[1] - 1)
    return p
