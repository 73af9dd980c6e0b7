"""The model's side of the DTensor operations (meshsim.ops.dtensor): each step simulated over the whole mesh by
meshsim.model.dtensor, for the right order and for torch's, shared by the ranks of a prediction that hold the same
blocks, and the collectives each step issues (the blocking calls the model plays against each other).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..core.wire import DTENSOR_CALL, NOT_SIMULATED, tensor_values
from ..model.expect import Err, ModelRaise, Quirk
from ..spec.placements import parse_placement, placement_text
from .registry import holds


class _Model:
    """meshsim.model.dtensor, imported on first use: ranks run only the torch parts and never import the model."""

    def __getattr__(self, name: str) -> Any:
        global D
        from ..model import dtensor

        D = dtensor  # the module itself from now on: a prediction looks names up in it ~10^5 times
        return getattr(dtensor, name)


if TYPE_CHECKING:
    from ..model import dtensor as D
else:
    D = _Model()


def rank_weight(rank: int) -> float:
    """What from_local adds to rank `rank`'s fresh block: sums over any set of ranks stay distinct (up to 32)."""
    return 4096.0 * (2.0 ** rank if rank < 32 else rank + 1)


def placements_of(a: dict, ndim: int) -> list[tuple]:
    return D.normalize([parse_placement(p) for p in a["placements"]], ndim)


# --------------------------------------------------------------------------------------------- the model's side


def _dtensor(run: Any, ref: str) -> D.DTensorModel:
    value = run.resolve(ref)
    if not isinstance(value, D.DTensorModel):
        raise ModelRaise(Err("HandleError", f"handle {ref!r} is not a DTensor"))
    return value


def _calls(run: Any, mesh: Any, comms: list[tuple[int, str]], what: str, detail: tuple = ()) -> None:
    """The blocking calls this rank makes, (mesh dim, the collective torch issues there) each: the model sees a
    hang when members disagree, and the fake tier checks the collectives a step issues (meshsim.judge)."""
    if mesh.coordinate is None:
        return
    for d, comm in comms:
        run.model.collective(f"{DTENSOR_CALL} {what}", mesh.groups[d], (comm, *detail))


def _move_calls(run: Any, mesh: Any, moves: list[D.Move], what: str, mismatch: D.SizeMismatch | None = None) -> None:
    """The collectives of a redistribution as torch makes them (a merged one on its flattened mesh's group), up to
    the one whose members pass different sizes (its detail says which size this rank passed)."""
    for move in moves:
        group = mesh.groups[move.dims[0]] if len(move.dims) == 1 else D.flattened_mesh(mesh, move.dims).groups[0]
        comm = D.transform_comm(move.current, move.target)
        if mismatch is not None and set(mismatch.dims) <= set(move.dims):
            run.model.collective(f"{DTENSOR_CALL} {what}", group, (comm, "sizes", mismatch.sent.get(run.model.rank)))
            return
        run.model.collective(f"{DTENSOR_CALL} {what}", group, (comm,))


class _Flattened:
    """D.flattened_dims that remembers whether torch merged anything (then the finding names the merge)."""

    def __init__(self, test: Any):
        self.test, self.used = test, False

    def __call__(self, dims: tuple[int, ...]) -> bool:
        hit = bool(self.test(dims))
        self.used = self.used or hit
        return hit


class _Unsimulated(Exception):
    """torch's side of a step the model does not simulate (members would plan it differently)."""


def _derive(prev: D.DTensorModel | None, mesh: Any, geo: D.Geometry | D.Unsimulated | None, shape: tuple,
            placements: list[tuple], sim: Any, key: Any = None) -> D.DTensorModel:
    """A new DTensor: `sim(geo, state, order, flattened)` run for the right side (coordinate order, dim by dim) and
    for torch's (group-rank order, collectives merged onto the root's flattened meshes; None: not simulated).
    `key`: what else the simulation depends on (the step and its arguments), so that the ranks of a prediction
    that hold the same blocks simulate the mesh once (None: every rank simulates)."""
    if geo is None:  # outside the mesh: torch keeps an empty local tensor and moves nothing
        state = {mesh.rank: D.empty_block()} if prev is None else prev.right
        return D.DTensorModel(mesh, geo, shape, placements, state, state)
    if isinstance(geo, D.Unsimulated):  # a mesh too large for values: shapes, offsets and collectives only
        return D.DTensorModel(mesh, geo, shape, placements, {}, None)
    if key is None:
        return _simulated(prev, mesh, geo, shape, placements, sim)
    inputs = (prev.right, prev.torch) if prev is not None else ()
    full = (key, tuple(geo.flat), geo.shape, mesh.layout, mesh.names, mesh.root_mesh.preserve,
            mesh.platform.release, D.flattened_layouts(mesh),
            D.contradicted(mesh, geo, mesh.rank), prev.finding if prev is not None else None)
    made = D.shared_sim(full, inputs, lambda: _simulated(prev, mesh, geo, shape, placements, sim))
    return D.DTensorModel(mesh, geo, shape, placements, made.right, made.torch, made.finding, made.beliefs)


def _simulated(prev: D.DTensorModel | None, mesh: Any, geo: D.Geometry, shape: tuple, placements: list[tuple],
               sim: Any) -> D.DTensorModel:
    right_before = prev.right if prev is not None else None
    torch_before = prev.torch if prev is not None else None
    beliefs = prev.beliefs if prev is not None else None
    narrows = holds("gather-narrows", mesh.platform)
    right = sim(geo, right_before, D.TorchOrder(D.coordinate_order, True, narrows), None)
    test = D.flattened_dims(mesh)
    flat = _Flattened(test) if test is not None else None
    # torch moves data in its groups' rank order: sorted, unless the mesh preserves its own (2.15)
    preserved = mesh.root_mesh.preserve
    scrambled = not preserved and any(geo.scrambled(d) for d in range(len(geo.shape)))
    copies = holds("gather-unpad-copies", mesh.platform)
    order = D.TorchOrder(D.coordinate_order if preserved else D.group_rank_order, copies, narrows)
    finding = prev.finding if prev is not None else D.FINDING
    torch: D.Blocks | None
    if D.contradicted(mesh, geo, mesh.rank):
        torch, finding = None, D.CONTRADICTED  # torch moves data along groups the model does not see
    elif prev is not None and torch_before is None:
        torch = None
    elif not scrambled and flat is None and copies and (prev is None or torch_before is right_before):
        torch = right
    else:
        try:
            torch = sim(geo, torch_before, order, flat)
        except _Unsimulated:
            torch = None
        if flat is not None and flat.used:
            finding = D.MERGED if not scrambled else D.FINDING
        elif scrambled:
            finding = D.FINDING
        elif not copies:
            finding = D.NOT_CONTIGUOUS
        if torch == right and (prev is None or torch_before is right_before):
            torch = right  # the same object: later steps need not simulate torch apart
    return D.DTensorModel(mesh, geo, shape, placements, right, torch, finding, beliefs)


def _geometry(mesh: Any) -> D.Geometry | D.Unsimulated | None:
    """The mesh's geometry (None outside it), one object for every rank of a replica."""
    if mesh.coordinate is None:
        return None
    return D.shared_sim(("geometry", id(mesh.view), tuple(mesh.shape)), (mesh.view,), lambda: D.geometry_of(mesh))


def _groups_needed(mesh: Any) -> None:
    """distribute_tensor and run_check's broadcasts ask a member's mesh for its groups (a rank outside the mesh
    returns an empty DTensor first)."""
    if not mesh.backend_ready and mesh.coordinate is not None:
        raise ModelRaise(Err("RuntimeError", "process groups not initialized"))


class _RankTensors(dict):
    """The global tensor each rank passes to distribute_tensor (`shape`, holding rank_weight(rank) + 0, 1, 2, ...:
    which rank's data torch sends shows), made when first asked for."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        self.shape = shape

    def __missing__(self, rank: int) -> D.Block:
        self[rank] = block = D.arange_block(self.shape, rank_weight(rank))
        return block


def src_data_rank(a: dict) -> int | None:
    value = a.get("src_data_rank", 0)
    return None if value == "none" else value


def model_distribute(run: Any, a: dict) -> D.DTensorModel:
    mesh = run.mesh(a["mesh"])
    shape = tuple(a["shape"])
    placements = placements_of(a, len(shape))
    src = src_data_rank(a)
    if holds("shard-dim-normalized", run.model.platform) and any(p[0] == "S" and p[1] < 0 for p in placements):
        # a member may fail first, sharding along the dim that index names (padding a dim too small, ...)
        raise ModelRaise(Err("AssertionError", "must be normalized") if mesh.coordinate is None else Err(None, ""))
    # distribute_tensor gives a rank outside the mesh an empty shard before it looks at the Shard's dim
    ndim = len(shape) if mesh.coordinate is not None else None
    D.check_placements(placements, mesh.ndim, ndim, holds("mixed-partials-refused", run.model.platform))
    if any(p[0] == "P" for p in placements) and not holds("distribute-partial", run.model.platform):
        raise ModelRaise(Err("RuntimeError", "Trying to distribute tensor with unsupported placements"))
    if src is not None and mesh.coordinate is not None and not holds("pad-empty-dims", run.model.platform) \
            and _pads_an_empty_dim(shape, placements, mesh.coordinate, tuple(mesh.shape)):
        raise ModelRaise(Err("RuntimeError", "The input size 0, plus negative padding"))
    _groups_needed(mesh)
    if src is not None and mesh.coordinate is not None and any(src >= n for n in mesh.shape):
        # a group rank no dim's group has: the backend refuses the root (gloo: "invalid root rank"), on every member
        raise ModelRaise(Err(None, ""))
    geo = _geometry(mesh)
    _calls(run, mesh, [(d, D.distribute_comm(p)) for d, p in enumerate(placements)] if src is not None else [],
           "distribute")
    return _derive(None, mesh, geo, shape, placements,
                   lambda g, _, order, flat: D.distribute(g, _RankTensors(shape), placements, order, src),
                   ("distribute", shape, tuple(placements), src))


def _pads_an_empty_dim(shape: tuple[int, ...], placements: list[tuple], coordinate: tuple[int, ...],
                       mesh_shape: tuple[int, ...]) -> bool:
    """Whether distribute_tensor pads a chunk of a tensor with a size-0 dim after the sharded one, on this rank:
    it splits its tensor as each mesh dim sees it and pads every short chunk (torch 2.9's F.pad refuses that)."""
    logical = D.logical_shapes(shape, placements, coordinate, mesh_shape)
    shards = [(i, p[1] % len(shape)) for i, p in enumerate(placements) if p[0] == "S"]  # (2.9 takes S(-1))
    return any(logical[i][d] % mesh_shape[i] and 0 in logical[i][d + 1:] for i, d in shards)


def torch_plan(dt: D.DTensorModel, target: list[tuple], flattened: Any) -> list[D.Move]:
    """torch's moves for this redistribution, merged where `flattened` finds a flattened mesh; every member plans
    alike (else _Unsimulated)."""
    geo, shape = dt.geometry, dt.shape
    plain = D.plain_moves(dt.placements, target, tuple(dt.mesh.shape))
    if flattened is None or geo is None:
        return plain
    if isinstance(geo, D.Unsimulated):  # no members' blocks at this size: this rank's own plan
        logical = D.logical_shapes(shape, dt.placements, dt.mesh.coordinate, tuple(dt.mesh.shape))
        return list(D.merged_moves(plain, tuple(dt.mesh.shape), flattened, logical))
    plans = set()
    for r in geo.flat:
        logical = D.logical_shapes((dt.beliefs or {}).get(r, shape), dt.placements, geo.coordinate[r], geo.shape)
        plans.add(tuple(D.merged_moves(plain, geo.shape, flattened, logical)))
    if len(plans) > 1:
        raise _Unsimulated()
    return list(plans.pop())


def model_redistribute(run: Any, dt: D.DTensorModel, target: list[tuple], what: str = "redistribute"
                       ) -> D.DTensorModel:
    if dt.geometry is None:
        return D.DTensorModel(dt.mesh, None, dt.shape, target, dt.right, dt.right)
    mesh = dt.mesh
    test = D.flattened_dims(mesh)
    plain = D.plain_moves(dt.placements, target, tuple(mesh.shape))  # torch's greedy plan, before its merge pass
    try:
        mine = torch_plan(dt, target, test)
    except _Unsimulated:
        mine = plain
    moves = [m for m in mine if D.comm_kind(m) and math.prod(mesh.shape[d] for d in m.dims) > 1]
    if moves and not mesh.backend_ready:
        raise ModelRaise(Err("AttributeError", "_dim_group_names"))  # funcol looks the groups up by name

    def sim(g: D.Geometry, state: D.Blocks, order: Any, flat: Any) -> D.Blocks:
        plan = torch_plan(dt, target, flat) if flat is not None else None
        return D.redistribute(g, dt.shape, state, dt.placements, target, order, plan, dt.beliefs)

    key = ("redistribute", dt.shape, tuple(dt.placements), tuple(target),
           tuple(sorted(dt.beliefs.items())) if dt.beliefs else None)
    refused = D.refused_lookup(mesh, plain) if holds("redistribute-comms", mesh.platform) else None
    try:
        result = _derive(dt, mesh, dt.geometry, dt.shape, target, sim, key)
    except D.SizeMismatch as exc:
        if refused is None:
            _move_calls(run, mesh, moves, what, exc)
        raise ModelRaise(Err(None, "")) from None  # right: an error; gloo: undefined (the prediction says so)
    except D.GatherWrongSize as misfit:  # after the gather, on every member
        if refused is None:
            _move_calls(run, mesh, moves[:next(i for i, m in enumerate(moves) if m.dims == misfit.dims) + 1], what)
        raise ModelRaise(Err("RuntimeError", "narrow unexpectedly changed" if misfit.longer else
                             "Expected cond to be True")) from None
    if refused is not None:  # torch raises while it plans, before any collective: the step's right value stands
        run.refusal = Quirk(None, Err("KeyError", "Mesh dim indices should be in ascending order"),
                            D.UNSORTED_LOOKUP)
        run.findings.add(D.UNSORTED_LOOKUP)
        return result
    failing = None if holds("pad-empty-dims", mesh.platform) else _pad_fails_at(dt, mine, run.model.rank)
    if failing is not None:  # this rank raises there, after the collectives before it; its peers wait in theirs
        _move_calls(run, mesh, [m for m in mine[:failing] if m in moves], what)
        raise ModelRaise(Err("RuntimeError", "The input size 0, plus negative padding"))
    _move_calls(run, mesh, moves, what)
    return result


def _pad_fails_at(dt: D.DTensorModel, moves: list[D.Move], rank: int) -> int | None:
    """The move at which torch 2.9's F.pad refuses this rank's tensor (a size-0 dim after the one it pads), if
    any: the rank's shard is short where a gather or an all_to_all pads it to the full chunk, or its tensor is
    split unevenly for a reduce_scatter. The logical shapes are the source placements' (2.9 computes them once)."""
    coordinate, mesh_shape = dt.mesh.coordinate, tuple(dt.mesh.shape)
    if coordinate is None:
        return None
    shape = (dt.beliefs or {}).get(rank, dt.shape)
    logical = D.logical_shapes(shape, dt.placements, coordinate, mesh_shape)
    placements = list(dt.placements)
    for index, move in enumerate(moves):
        i = move.dims[0]
        local = list(D.logical_shapes(shape, placements, coordinate, mesh_shape)[-1])
        if any(_pads_before_empty(local, d, pad) for d, pad in _pads(move, local, logical[i], mesh_shape[i])):
            return index
        placements[i] = move.target
    return None


def _pads(move: D.Move, local: list[int], logical: tuple[int, ...], n: int) -> list[tuple[int, int]]:
    """(tensor dim, pad size) of each pad torch 2.9 applies in this move (`local` is updated as it pads)."""
    current, target = move.current, move.target
    if current[0] == "P" and target[0] == "S":  # _split_tensor with padding: the short chunks are padded
        d = target[1]
        return [(d, D.full_chunk(local[d], n) - length) for _, length in D.chunk_bounds(local[d], n)] \
            if local[d] % n else []
    if current[0] != "S" or target[0] == "P" or current == target:
        return []
    out = []
    d = current[1]
    if logical[d] % n:
        out.append((d, D.full_chunk(logical[d], n) - local[d]))
        local[d] = D.full_chunk(logical[d], n)
    if target[0] == "S" and logical[target[1]] % n:
        d2 = target[1]
        out.append((d2, D.full_chunk(logical[d2], n) * n - local[d2]))
    return out


def _pads_before_empty(local: list[int], dim: int, pad: int) -> bool:
    return pad > 0 and 0 in local[dim + 1:]


def plain_observation(dt: D.DTensorModel, rank: int, whole: bool, gathered: bool = False) -> Any:
    """What `rank` observes of a plain tensor it takes out of a DTensor: its block (to_local) or the whole tensor
    (full_tensor; `gathered`: there was something to gather). Where values are not simulated, the shape alone, and
    the layout only of a gather's fresh (contiguous) tensor: with nothing to gather, full_tensor gives the block
    back as it is (a Shard -> Shard move's block may be a view)."""
    if not dt.simulated:
        shape = dt.shape if whole else D.local_shape_and_offset(dt.shape, dt.placements, dt.mesh.coordinate,
                                                                 dt.mesh.shape)[0]
        return {"shape": list(shape), "values": NOT_SIMULATED,
                "contiguous": True if whole and gathered else NOT_SIMULATED}
    return dt.observe(rank, plain_tensor_seen_by(rank))


def plain_tensor_seen_by(rank: int) -> Any:
    """What `rank` observes of a plain tensor it holds (to_local, full_tensor): shape, values, contiguity."""

    def seen(state: dict) -> Any:
        block = state.get(rank, D.empty_block())
        return {"shape": list(block.shape), "values": tensor_values(block.values), "contiguous": D.contiguity(block)}

    return seen


def check_redistribute_target(run: Any, dt: D.DTensorModel, target: list[tuple]) -> None:
    """DTensor.redistribute refuses a new Partial first (but Shard -> Partial(sum), from 2.14; and any Partial at
    all before 2.10), then a placement list that does not fit."""
    on = run.model.platform
    for current, wanted in zip(dt.placements, target):
        if wanted[0] == "P" and not holds("redistribute-keeps-partial", on):
            raise ModelRaise(Err("RuntimeError", "Can not redistribute to Partial"))
        if wanted[0] == "P" and current != wanted and not (
                current[0] == "S" and wanted == ("P", "sum") and holds("shard-to-partial", on)):
            raise ModelRaise(Err("RuntimeError", f"Can not redistribute from {placement_text(current)}"))
    D.check_placements(target, dt.mesh.ndim, len(dt.shape), holds("mixed-partials-refused", on))


def global_shape(local: tuple[int, ...], placements: list[tuple], mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
    """compute_global_tensor_info without a given shape: as if every shard were as large as this one."""
    out = list(local)
    for i, p in enumerate(placements):
        if p[0] == "S":
            out[p[1]] *= mesh_shape[i]
    return tuple(out)
