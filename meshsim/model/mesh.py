"""DeviceMesh as one rank sees it, emulated in pure Python.

The emulator's *state* (which groups exist, which meshes a call returns) follows what torch's code does,
because later steps depend on it; where torch's answer is wrong or undocumented, the *observation* carries a
Quirk with the right value beside torch's, naming the finding (see meshsim.model.findings). What a rank holds
(its groups, calls and meshes) is meshsim.model.mesh_state's, re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeVar

from ..spec.platform import CPU, Platform
from . import layout as L
from .expect import Err, ModelRaise, Quirk, quirk
from .mesh_state import WORLD_KEY, Call, Group, MeshModel, names_out_of_order, summary
from .semantics import holds

# What this module re-exports (meshsim.model.mesh_state's, and the platform a RankModel runs on)
__all__ = ["WORLD_KEY", "Call", "Group", "MeshModel", "Platform", "summary"]

T = TypeVar("T")

FLATTEN_OUTSIDE = "flatten-outside-the-mesh-fails"
UNFLATTEN_BY_NAME = "unflatten-name-check-inverted"


class RankModel:
    """Every DeviceMesh call of the plan language, on one rank."""

    def __init__(self, rank: int, world: int, platform: Platform = CPU):
        self.rank = rank
        self.world = world
        self.platform = platform
        self.group_counter = 0  # torch's _world.group_count: every new_group call bumps it on every rank
        self.calls: list[Call] = []
        # (mesh handle, dim) of the collective being made, as torch's progress says
        self.context: tuple[Any, ...] | None = None
        # (step, shape, names, ranks) of each mesh whose groups it made, as torch's progress says
        self.meshes: list[tuple[Any, ...]] = []
        self.seq: dict[tuple[Any, ...], int] = {}
        self.step = -1
        self.findings: set[str] = set()
        self.world_group = Group(WORLD_KEY, L.identity_map(world), L.identity_map(world), "default_pg")
        # What this rank's answers depended on, for meshsim.model.classes: every geometry and dim it asked about, and
        # for each group it created along a dim of a mesh the plan names, the dim's kind (the counter where the
        # dim's groups start, the dim, id of the rank map)
        self.touched: dict[int, Any] = {}
        self.kinds: dict[tuple[Any, ...], tuple[int, L.Dim, int]] = {}
        self.kind_dims: dict[tuple[int, L.Dim, int], L.DimInfo] = {}
        self.dim_groups: set[int] = set()  # ids of the member tuples of groups made along mesh dims

    def geometry(self, layout: L.Layout, rank_map: tuple[int, ...]) -> L.Geometry:
        geo = L.geometry(layout, rank_map)
        self.touched[id(geo)] = geo
        return geo

    def dim_info(self, dim: L.Dim, rank_map: tuple[int, ...]) -> L.DimInfo:
        info = L.dim_info(dim, rank_map, self.world)
        self.touched[id(info)] = info
        return info

    # ------------------------------------------------------------------ groups and calls

    def new_group(self, ranks: list[int], order: tuple[int, ...] | None = None) -> Group | None:
        """dist.new_group(ranks): every rank calls it; members block until all members have."""
        ranks_sorted = sorted(ranks)
        refusal = L.group_refusal(ranks_sorted, self.world)
        if refusal is not None:
            raise ModelRaise(Err("ValueError", refusal))
        members = tuple(ranks_sorted)
        self.touched[id(members)] = members
        if self.rank not in ranks_sorted:
            self.group_counter += 1
            return None
        return self._create(members, tuple(order) if order is not None else members)

    def _create(self, members: tuple[int, ...], order: tuple[int, ...], desc: str = "undefined",
                preserve: bool = False) -> Group:
        """A valid group this rank is a member of (members sorted): the next name, and a blocking call; its group
        ranks in mesh order where the mesh preserves it (new_group(sort_ranks=False))."""
        key = (self.group_counter, members)
        self.group_counter += 1
        self.calls.append(Call("create", key, members, self.step, (desc,)))
        return Group(key, order if preserve else members, order, desc)

    def collective(self, op: str, group: Group, detail: tuple[Any, ...] = ()) -> None:
        n = self.seq.get(group.key, 0)
        self.seq[group.key] = n + 1
        self.calls.append(Call(op, group.key + (n,), group.ranks, self.step, detail, self.context))

    def _init_process_groups(self, layout: L.Layout, rank_map: tuple[int, ...], names: tuple[str, ...] | None,
                             forced: tuple[bool, ...] = (), preserve: bool = False) -> list[Group]:
        """DeviceMesh._init_process_groups: one group per replica of every dim, in mesh order. `forced`: the dims
        with a backend_override, which get new groups even where the dim spans the world."""
        found: list[Group | None] = []
        for index, dim in enumerate(layout):
            if names and index >= len(names):
                raise ModelRaise(Err("IndexError", "tuple index out of range"))
            found.append(self._init_one_group(dim, rank_map, f"mesh_{names[index] if names else f'dim_{index}'}",
                                              index < len(forced) and forced[index], preserve, len(layout) == 1))
        present = [g for g in found if g is not None]
        if present and len(present) != len(found):
            raise ModelRaise(Err("AssertionError", ""))
        return present

    def _init_one_group(self, dim: L.Dim, rank_map: tuple[int, ...], desc: str, forced: bool = False,
                        preserve: bool = False, one_dim: bool = True) -> Group | None:
        """DeviceMesh._init_one_process_group: every rank calls new_group for every group along the dim, in
        mesh order; it keeps the one it is in. Only the calls that matter to this rank are walked (its own
        groups, and the first invalid group, where new_group raises); the others only advance the counter."""
        info = self.dim_info(dim, rank_map)
        reuses = one_dim or holds("world-dim-default-group", self.platform)
        if info.spans_world and not forced and reuses and not (preserve and info.order(0) != self.world_group.ranks):
            # A dim spanning the world reuses the default group (whatever order the mesh gives it, unless the
            # mesh preserves its order).
            return Group(WORLD_KEY, self.world_group.ranks, info.order(0), self.world_group.desc)
        start = self.group_counter
        bad = info.first_invalid
        mine = None
        for index in info.member_of(self.rank):
            if bad is not None and index >= bad[0]:
                break
            self.group_counter = start + index
            group = self._create(info.ranks(index), info.order(index), desc, preserve)
            self.dim_groups.add(id(group.ranks))
            if L.is_plan_map(rank_map):  # the same groups on every rank: one kind (else each group is its own)
                kind = self.kinds[group.key] = (start, dim, id(rank_map))
                self.kind_dims[kind] = info
            if mine is not None:
                raise ModelRaise(Err("RuntimeError", "Each device mesh dimension should get only one process group"))
            mine = group
        if bad is not None:
            self.group_counter = start + bad[0]
            raise ModelRaise(Err("ValueError", bad[1]))
        self.group_counter = start + info.count
        return mine

    # ------------------------------------------------------------------ construction

    def construct(self, layout: L.Layout, rank_map: tuple[int, ...], names: tuple[str, ...] | None,
                  root: MeshModel | None, init_backend: bool, device: str | None = None,
                  as_rank: int | None = None, forced: tuple[bool, ...] = (), preserve: bool | None = None
                  ) -> MeshModel:
        """DeviceMesh.__init__ with a layout over a rank map (device: the root's, else the platform's; preserve:
        preserve_rank_order, a derived mesh's the root's)."""
        if not L.is_orthogonal(L.collapse(layout)):
            raise ModelRaise(Err("AssertionError", "Please use a non-overlapping layout"))
        device = device or (root.device if root is not None else self.platform.device)
        preserve = root.root_mesh.preserve if preserve is None and root is not None else bool(preserve)
        mesh = MeshModel(layout, rank_map, tuple(names) if names else None, root, self.rank, device=device,
                         backend_ready=init_backend, preserve=preserve, platform=self.platform)
        if init_backend:
            numel = math.prod(L.sizes_of(layout))
            if numel > self.world:
                raise ModelRaise(Err("RuntimeError", f"Mesh should not be bigger than default world size {self.world}"))
            if device == "cuda" and not self.platform.cuda:
                # DeviceMesh sets the rank's CUDA device, and there is none: a CPU build says "Torch not compiled
                # with CUDA enabled", a CUDA build "Found no NVIDIA driver on your system"
                raise ModelRaise(Err(None, "NVIDIA driver" if self.platform.cuda_build else "cuda"))
            self.meshes.append((self.step, L.sizes_of(layout), mesh.names, L.shared_flat_ranks(layout, rank_map)))
            mesh.groups = self._init_process_groups(layout, rank_map, mesh.names, forced, preserve)
        mesh.view, mesh.coordinate = self._placed(layout, rank_map, self.rank if as_rank is None else as_rank)
        if isinstance(mesh.view, Err):
            raise ModelRaise(mesh.view)  # __init__ reads the mesh property to find this rank's coordinate
        return mesh

    def _placed(self, layout: L.Layout, rank_map: tuple[int, ...], as_rank: int) -> tuple[Any, tuple[int, ...] | None]:
        """The `mesh` property (the replica holding this rank, or the only one) and the coordinate of `as_rank`
        (this rank, unless the mesh was built with _rank=)."""
        try:
            geo = self.geometry(layout, rank_map)
        except L.LayoutError as exc:
            return Err("RuntimeError", str(exc)), None
        shape = L.sizes_of(layout)
        spots = geo.spots(self.rank)
        if geo.replicas == 1:
            replica = 0
        elif spots:
            replica = spots[0][0]
        else:
            return Err("RuntimeError", "In order to get the mesh Tensor of a DeviceMesh it needs to"), None
        if as_rank != self.rank:
            spots = geo.spots(as_rank)
        here = [flat for rep, flat in spots if rep == replica]
        if len(here) > 1:
            raise ModelRaise(Err("AssertionError", "rank_coords.size(0) must be 0 or 1"))
        view = L.shared_view(layout, rank_map, replica)
        return view, (_unravel(here[0], shape) if here else None)

    def init_device_mesh(self, shape: list[int], names: list[str] | None, device: str | None = None,
                         overrides: list[Any] | None = None) -> MeshModel:
        if names is not None:
            if len(set(names)) != len(names):
                raise ModelRaise(Err("RuntimeError", "Each mesh_dim_name must be unique"))
            if len(shape) != len(names):
                raise ModelRaise(Err("RuntimeError", "mesh_shape and mesh_dim_names should have same length"))
        forced = normalized_overrides(overrides, len(shape), names) if overrides is not None else ()
        if device and not device.isalpha():
            raise ModelRaise(Err("RuntimeError", "Device type with index is not supported"))
        layout = L.row_major(tuple(shape))
        return self.construct(layout, L.identity_map(math.prod(shape)), tuple(names) if names else None, None, True,
                              device, forced=forced)

    def explicit(self, ranks_flat: list[int], shape: tuple[int, ...], names: list[str] | None,
                 init_backend: bool = True, device: str | None = None, as_rank: int | None = None,
                 preserve: bool = False) -> MeshModel:
        """DeviceMesh(device_type, mesh=<nested ranks>, preserve_rank_order=preserve)."""
        names_t = tuple(names) if names else None
        flat = tuple(ranks_flat)
        repeated = L._shared("repeated", (), flat, lambda: len(set(flat)) != len(flat))
        bad_names = names_t is not None and (len(set(names_t)) != len(names_t) or len(names_t) != len(shape))
        if not (repeated or bad_names):
            return self.construct(L.row_major(shape), flat, names_t, None, init_backend, device, as_rank,
                                  preserve=preserve)
        # torch accepts both; the right answer is to reject them on every rank.
        finding = "repeated-rank-accepted" if repeated else "devicemesh-names-unchecked"
        self.findings.add(finding)
        right = Err(None, "")
        try:
            mesh = self.construct(L.row_major(shape), flat, names_t, None, init_backend, device, as_rank,
                                  preserve=preserve)
        except ModelRaise as exc:
            raise ModelRaise(Quirk(right, exc.err, finding)) from None
        mesh.creation_quirk = Quirk(right, None, finding)
        return mesh

    # ------------------------------------------------------------------ derived meshes

    def slice(self, mesh: MeshModel, requested: str | list[str], as_list: bool = False) -> MeshModel:
        """mesh[names]; as_list: the names passed as a list, which never equals the mesh's own tuple of names,
        so torch builds a new submesh even for all of them."""
        if not mesh.names:
            raise ModelRaise(Err("RuntimeError", "Cannot slice a DeviceMesh without mesh_dim_names"))
        req = (requested,) if isinstance(requested, str) else tuple(requested)
        if req == mesh.names and not (as_list and not isinstance(requested, str)):
            return mesh
        root = mesh.root_mesh
        from_root = mesh.same_as(root)
        flat = {k: m.layout[0] for k, m in root.flatten_mapping.items()} if from_root else {}
        valid = [*mesh.names, *flat]
        if not all(n in valid for n in req):
            raise ModelRaise(Err("KeyError", "Valid mesh_dim_names are"))
        dims = [_index(mesh.layout, mesh.names.index(n), "tuple index out of range") if n in mesh.names else flat[n]
                for n in req]
        merged = L.collapse(tuple(dims))
        refusal = None if holds("mesh-layout", self.platform) else names_out_of_order(mesh, req, root.flatten_mapping)
        if refusal is not None:  # 2.9 orders a slice by its names, not by its layout
            self.findings.update({refusal.finding} if isinstance(refusal, Quirk) else set())
            raise ModelRaise(refusal)
        if not L.is_descending(merged):
            self.findings.add("slice-order-docstring")
            raise ModelRaise(Quirk(Err("KeyError", "Mesh dim indices should be in ascending order"),
                                   Err("KeyError", "Mesh dim indices should be in ascending order"),
                                   "slice-order-docstring"))
        if not L.is_orthogonal(merged):
            overlap = holds("slice-overlap-error", self.platform)
            raise ModelRaise(Err("RuntimeError", "Slicing overlapping dim_names") if overlap else
                             Err("KeyError", "Invalid mesh_dim_names"))
        groups: list[Group] = []
        if not mesh.backend_ready:
            raise ModelRaise(Err("AttributeError", "_dim_group_names"))
        if mesh.groups and len(mesh.groups) != len(mesh.names):  # names of the wrong length were let through
            raise ModelRaise(Err("AssertionError", "The number of dim_group_names and mesh_dim_names should have"))
        if mesh.coordinate is None and mesh.ndim > 1 and not holds("slice-outside-the-mesh", self.platform):
            raise ModelRaise(Err("IndexError", "list index out of range"))  # (measured on 2.9.1 and 2.10.0)
        if mesh.groups:
            for n in req:
                if n in mesh.names:
                    groups.append(mesh.groups[mesh.names.index(n)])
                else:
                    source = mesh.flatten_mapping.get(n)
                    if source is None:
                        raise ModelRaise(Err("KeyError", n))
                    if not source.groups:
                        raise ModelRaise(Err("IndexError", "list index out of range"))
                    groups.append(source.groups[0])
        return self.construct(tuple(dims), root.rank_map, req, root, False).given(groups)

    def flatten(self, mesh: MeshModel, name: str | None, override: bool = False) -> MeshModel:
        if not mesh.names:
            raise ModelRaise(Err("RuntimeError", "Cannot flatten a DeviceMesh without mesh_dim_names"))
        name = name or "_".join(mesh.names)
        by_layout = holds("flatten-by-layout", self.platform)
        if by_layout and mesh.ndim == 1 and name in mesh.names:
            return mesh
        root = mesh.root_mesh
        if root.names is None:
            raise ModelRaise(Err("TypeError", "Invariant encountered"))
        if not by_layout and any(n not in root.names for n in mesh.names):  # torch < 2.10 looks each name up
            raise ModelRaise(Err("ValueError", "not in tuple"))  # among the root's dims: a flattened one is not
        if name in root.names:
            raise ModelRaise(Err("ValueError" if holds("flatten-clash-valueerror", self.platform) else "RuntimeError",
                                 "already exists for submesh of the"))
        flat = (L.collapse(mesh.layout),)
        existing = root.flatten_mapping.get(name)
        if existing is not None:
            if existing.layout == flat or not by_layout:  # torch < 2.10 hands back the first mesh of a name
                return existing
            raise ModelRaise(Err("ValueError", "has been created before"))
        result = self.construct(flat, root.rank_map, (name,), root, True, forced=(override,))
        if result.coordinate is None and not by_layout:  # torch < 2.10 fails on a rank outside the mesh
            self.findings.add(FLATTEN_OUTSIDE)
            raise ModelRaise(Quirk(summary(result), Err("UnboundLocalError", "res_flattened_mesh"), FLATTEN_OUTSIDE))
        if not by_layout:
            result.root_dims = tuple(root.names.index(n) for n in mesh.names)
        root.flatten_mapping[name] = result
        return result

    def unflatten(self, mesh: MeshModel, dim: int | str, sizes: list[int], names: list[str],
                  overrides: list[Any] | None = None) -> MeshModel:
        if isinstance(dim, int) and dim >= mesh.ndim:
            raise ModelRaise(Err("ValueError", "specified in `_unflatten` is out of range"))
        if isinstance(dim, str):
            if mesh.names is None:
                raise ModelRaise(Err("TypeError", "Invariant encountered"))
            inverted = not holds("unflatten-by-name", self.platform)
            if dim not in mesh.names:  # (2.10 and 2.11 then fail at names.index: "x not in tuple")
                raise ModelRaise(Err("ValueError", "not in" if inverted else "specified in `_unflatten` is not in"))
            if inverted:  # their check refuses every name the mesh has
                self.findings.add(UNFLATTEN_BY_NAME)
                meant = f"the mesh with dim {dim!r} unflattened into {tuple(names)}"
                raise ModelRaise(Quirk(meant, Err("ValueError", "specified in `_unflatten` is not in"),
                                       UNFLATTEN_BY_NAME))
        if len(sizes) != len(names):
            raise ModelRaise(Err("RuntimeError", "mesh_dim_names must have same length as mesh_sizes"))
        index = mesh.names.index(dim) if isinstance(dim, str) else dim  # type: ignore[union-attr]
        forced = normalized_overrides(overrides, len(sizes), names) if overrides is not None else ()
        if index < -mesh.ndim:
            raise ModelRaise(Err("IndexError", "tuple index out of range"))
        target = mesh.layout[index]
        if math.prod(sizes) != L.size_of(target):
            err = Err("ValueError", "These must be equal for unflatten to work correctly")
            if mesh.ndim == 1:  # the docstring's own example is such a call
                self.findings.add("unflatten-docstring-example")
                raise ModelRaise(Quirk(err, err, "unflatten-docstring-example"))
            raise ModelRaise(err)
        try:
            parts = L.split(target, tuple(sizes))
        except L.LayoutError:
            self.findings.add("unflatten-bare-assertion")
            raise ModelRaise(Quirk(Err(None, ""), Err("AssertionError", ""), "unflatten-bare-assertion")) from None
        if mesh.names is None:
            raise ModelRaise(Err("TypeError", "Invariant encountered"))
        # torch splices with [dim:dim + 1], so dim=-1 inserts before the last dim instead of replacing it.
        axes = list(mesh.layout)
        axes[index:index + 1] = list(parts)
        all_names = list(mesh.names)
        all_names[index:index + 1] = list(names)
        root = mesh.root_mesh
        right = self._unflatten_right(mesh, index, parts, names) if index == -1 else None
        try:
            result = self.construct(tuple(axes), root.rank_map, tuple(all_names), root, False)
        except ModelRaise as exc:
            if right is None:
                raise
            self.findings.add("unflatten-negative-dim")
            raise ModelRaise(Quirk(right, exc.err, "unflatten-negative-dim")) from None
        if mesh.backend_ready:  # torch makes the new dims' groups only when the mesh has groups
            new_groups = self._init_process_groups(parts, root.rank_map, tuple(names), forced, root.preserve)
            groups = list(mesh.groups)
            groups[index:index + 1] = new_groups
            result.given(groups)
        if right is not None:
            self.findings.add("unflatten-negative-dim")
            result.creation_quirk = Quirk(right, None, "unflatten-negative-dim")
        elif len(set(all_names)) != len(all_names):
            self.findings.add("unflatten-duplicate-names")
            result.creation_quirk = Quirk(Err(None, ""), None, "unflatten-duplicate-names")
        return result

    def _unflatten_right(self, mesh: MeshModel, index: int, parts: L.Layout, names: list[str]) -> Any:
        """What _unflatten(-1, ...) should give: the last dim replaced (observed as a mesh summary)."""
        end = mesh.ndim + index
        axes = mesh.layout[:end] + tuple(parts) + mesh.layout[end + 1:]
        all_names = mesh.names[:end] + tuple(names) + mesh.names[end + 1:]  # type: ignore[index]
        try:
            return summary(self.construct(axes, mesh.root_mesh.rank_map, all_names, mesh.root_mesh, False))
        except ModelRaise as exc:
            return exc.err

    def concatenate(self, meshes: list[MeshModel]) -> MeshModel:
        axes: list[L.Dim] = []
        names: list[str] = []
        groups: list[Group] = []
        first_map = meshes[0].rank_map
        for m in meshes:
            axes.extend(m.layout)
            if m.names is None:
                raise ModelRaise(Err("TypeError", "Invariant encountered"))
            if not m.backend_ready:
                raise ModelRaise(Err("AttributeError", "_dim_group_names"))
            names.extend(m.names)
            groups.extend(m.groups)
            if m.rank_map != first_map:
                raise ModelRaise(Err("RuntimeError",
                                     "Cannot concatenate DeviceMeshes derived from different device mesh"))
        self._concatenation_fits(L.collapse(tuple(axes)), first_map)
        result = self.construct(tuple(axes), first_map, tuple(names), meshes[0].root_mesh, False).given(groups)
        if len(set(names)) != len(names):
            self.findings.add("concatenate-duplicate-names")
            result.creation_quirk = Quirk(Err(None, ""), None, "concatenate-duplicate-names")
        return result

    def _concatenation_fits(self, flat: L.Dim, rank_map: tuple[int, ...]) -> None:
        """torch 2.13 on refuses an interleaved concatenation (check_orthogonal); before, only one that repeats a
        position (check_non_overlap), and the new mesh then asserts that its positions fit the rank map."""
        if holds("concatenate-orthogonal", self.platform):
            if not L.is_orthogonal(flat):
                raise ModelRaise(Err("RuntimeError", "Cannot concatenate overlapping meshes"))
            return
        positions = L.positions(flat)
        if len(set(positions)) != len(positions):
            raise ModelRaise(Err("RuntimeError", "Cannot concatenate overlapping meshes"))
        if max(positions) >= len(rank_map):
            raise ModelRaise(Err("AssertionError", "The rank map contains"))

    def from_groups(self, groups: list[Group], layout_flat: list[int] | None, shape: tuple[int, ...] | None,
                    names: list[str] | None, one_d: bool, device: str | None = None) -> MeshModel:
        names_t = tuple(names) if names else None
        if one_d:
            group = groups[0]
            ranks = list(group.ranks)
            if layout_flat is not None and (shape != (len(layout_flat),) or tuple(layout_flat) != group.ranks):
                raise ModelRaise(Err("ValueError", "Invalid mesh"))
            mesh = self.construct(L.row_major((len(ranks),)), tuple(ranks), names_t, None, False, device)
            return self._names_unchecked(mesh.given([group]))
        if not groups:
            raise ModelRaise(Err("ValueError", "Expects at least one ProcessGroup to be passed"))
        if layout_flat is None or shape is None:
            raise ModelRaise(Err("ValueError", "Must pass mesh if passing multiple ProcessGroups"))
        if names_t is None:
            raise ModelRaise(Err("ValueError", "Must pass mesh_dim_names if passing multiple ProcessGroups"))
        if len(shape) != len(groups):
            raise ModelRaise(Err("ValueError", "Expects mesh with ndim equal to number of ProcessGroups"))
        mesh = self.construct(L.row_major(shape), tuple(layout_flat), names_t, None, False, device)
        if any(g is None for g in groups):  # a rank in none of a dim's groups passes None
            raise ModelRaise(Err("AttributeError", "group_name"))
        return self._names_unchecked(mesh.given(groups))

    def _names_unchecked(self, mesh: MeshModel) -> MeshModel:
        """from_group builds the mesh without checking its names (a finding); slicing it then fails."""
        if mesh.names is not None and len(mesh.names) != mesh.ndim:
            self.findings.add("from-group-names-unchecked")
            mesh.creation_quirk = Quirk(Err(None, ""), None, "from-group-names-unchecked")
        return mesh

    def all_submeshes(self, mesh: MeshModel, name: str) -> list[MeshModel]:
        index = self.dim_by_name(mesh, name)
        out = []
        info = self.dim_info(_index(mesh.layout, index, "tuple index out of range"), mesh.rank_map)
        for ranks in (info.order(i) for i in range(info.count)):
            if self.rank in ranks and not mesh.backend_ready:  # torch reads the groups only where it is a member
                raise ModelRaise(Err("AttributeError", "_dim_group_names"))
            sub = self.construct(L.row_major((len(ranks),)), ranks, (name,), None, False, mesh.device)
            sub.given([mesh.groups[index]] if self.rank in ranks else [])
            out.append(sub)
        return out

    # ------------------------------------------------------------------ queries

    def root_mesh_dim(self, mesh: MeshModel) -> int | None:
        """_get_root_mesh_dim(): where a 1-D named mesh's dim sits in its root (looked up by name)."""
        if not mesh.names:
            return None
        if len(mesh.names) != 1:
            raise ModelRaise(Err("AssertionError", "The submesh can only be a 1D mesh"))
        return self.dim_by_name(mesh.root_mesh, mesh.names[0])

    def dim_by_name(self, mesh: MeshModel, name: str) -> int:
        if not mesh.names:
            raise ModelRaise(Err("KeyError", "No `mesh_dim_names` found."))
        if name not in mesh.names:
            raise ModelRaise(Err("KeyError", f"Mesh dimension '{name}' does not exist."))
        return mesh.names.index(name)

    def get_group(self, mesh: MeshModel, dim: int | str | None) -> Group:
        """What torch's get_group returns."""
        if not mesh.backend_ready:
            raise ModelRaise(Err("RuntimeError", "DeviceMesh process groups not initialized"))
        if mesh.ndim > 1 and dim is None:
            raise ModelRaise(Err("RuntimeError", "Found the DeviceMesh have"))
        if dim is None:
            return _index(mesh.groups, 0)
        shadow = mesh.root_mesh.flatten_mapping.get(dim) if isinstance(dim, str) else None
        if shadow is not None:
            return _index(shadow.groups, 0)
        index = self.dim_by_name(mesh, dim) if isinstance(dim, str) else dim
        return _index(mesh.groups, index)

    def group_observation(self, mesh: MeshModel, dim: int | str | None) -> Any:
        """get_process_group_ranks(get_group(dim)), with the right answer where torch's differs."""
        group = self.get_group(mesh, dim)
        if self._foreign_flattened(mesh, dim):
            return Quirk(Err("KeyError", "does not exist"), list(group.ranks), "get-group-foreign-flattened-name")
        right_group = self._own_group(mesh, dim, group)
        self.note_order(right_group)
        return quirk(list(right_group.order), list(group.ranks),
                     "get-group-name-shadowed-by-flatten" if right_group is not group else "group-rank-order")

    def _foreign_flattened(self, mesh: MeshModel, dim: int | str | None) -> bool:
        """Whether get_group(dim) on a submesh answers with a flattened dim of its root that the submesh does
        not have: torch looks names up in the root's _flatten_mapping first (a finding)."""
        if not isinstance(dim, str) or mesh.root is None or (mesh.names and dim in mesh.names):
            return False
        if dim in mesh.root.flatten_mapping and mesh is not mesh.root.flatten_mapping[dim]:
            self.findings.add("get-group-foreign-flattened-name")
            return True
        return False

    def local_rank_observation(self, mesh: MeshModel, dim: int | str | None) -> Any:
        if mesh.ndim > 1 and dim is None:
            raise ModelRaise(Err("RuntimeError", "Found the DeviceMesh have"))
        group = self.get_group(mesh, 0 if dim is None else dim)
        if self._foreign_flattened(mesh, dim):
            return Quirk(Err("KeyError", "does not exist"), group.group_rank(self.rank),
                         "get-group-foreign-flattened-name")
        right_group = self._own_group(mesh, dim, group)
        self.note_order(right_group)
        right = right_group.order.index(self.rank) if self.rank in right_group.order else -1
        finding = "get-group-name-shadowed-by-flatten" if right_group is not group else "group-rank-order"
        return quirk(right, group.group_rank(self.rank), finding)

    def _own_group(self, mesh: MeshModel, dim: int | str | None, torch_group: Group) -> Group:
        """The group of the mesh's own dim (torch may answer a by-name query from the root's flattened dims)."""
        if isinstance(dim, str) and mesh.names and dim in mesh.names and dim in mesh.root_mesh.flatten_mapping:
            own = _index(mesh.groups, mesh.names.index(dim))
            if own.ranks != torch_group.ranks or own.order != torch_group.order:
                self.findings.add("get-group-name-shadowed-by-flatten")
                return own
        return torch_group

    def note_order(self, group: Group) -> None:
        if group.order != group.ranks:
            self.findings.add("group-rank-order")

    def size(self, mesh: MeshModel, dim: int | str | None) -> int:
        if dim is None:
            return math.prod(mesh.shape)
        n = len(mesh.shape)
        if not holds("size-from-layout", self.platform):  # the mesh tensor's size
            if isinstance(dim, str):
                raise ModelRaise(Err("RuntimeError", f"Name '{dim}' not found in Tensor[{', '.join(['None'] * n)}]."))
            if isinstance(dim, int) and not -n <= dim < n:
                raise ModelRaise(Err("IndexError", f"Dimension out of range (expected to be in range of [{-n}, "
                                     f"{n - 1}], but got {dim})"))
        if isinstance(dim, str):
            raise ModelRaise(Err("TypeError", "tuple indices must be integers or slices, not str"))
        if isinstance(dim, int) and not -n <= dim < n and not holds("flat-layout", self.platform):
            raise ModelRaise(Err("IndexError", f"Dim {dim} is out of range for layout with {n} dimensions. Expected "
                                 f"dim to be in range [{-n}, {n - 1}]."))
        return L.size_of(_index(mesh.layout, dim, "tuple index out of range"))

    def mesh_view(self, mesh: MeshModel) -> Any:
        if isinstance(mesh.view, Err):
            raise ModelRaise(mesh.view)
        return mesh.view

def normalized_overrides(overrides: list[Any], ndim: int, names: Any) -> tuple[bool, ...]:
    """torch's _normalize_backend_override: each dim's override by name or by index (not both), and no key left
    over. Returns which dims have one."""
    left = list(dict.fromkeys(key for key, _ in overrides))  # a dict in torch: a repeated key counts once
    forced = []
    for index in range(ndim):
        name = names[index] if names and index < len(names) else None
        if name is not None and name in left:
            if index in left:
                raise ModelRaise(Err("RuntimeError", f"Found redundant dim index {index} and name {name} in "
                                                     "backend_override"))
            left.remove(name)
            forced.append(True)
        elif index in left:
            left.remove(index)
            forced.append(True)
        else:
            forced.append(False)
    if left:
        raise ModelRaise(Err("RuntimeError", f"Found invalid keys in backend_override: got {left!r}"))
    return tuple(forced)


def _index(seq: Sequence[T], index: Any, message: str = "list index out of range") -> T:
    try:
        item: T = seq[index]
        return item
    except IndexError:
        raise ModelRaise(Err("IndexError", message)) from None
    except TypeError:
        raise ModelRaise(Err("TypeError", "indices must be integers")) from None


def _unravel(index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    coord = []
    for size in reversed(shape):
        coord.append(index % size)
        index //= size
    return tuple(reversed(coord))
