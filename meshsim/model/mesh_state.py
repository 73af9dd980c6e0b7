"""What a rank holds of DeviceMesh, in pure Python: its process groups (Group), the blocking calls it makes (Call),
its meshes (MeshModel), and what it observes of a mesh (summary). meshsim.model.mesh's RankModel makes and derives
them as torch's code does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..spec.platform import CPU, Platform
from . import layout as L
from .expect import Err, Quirk

WORLD_KEY = ("world",)



@dataclass(frozen=True)
class Group:
    """A process group: `ranks` in torch's group-rank order (sorted; mesh order on a mesh built with
    preserve_rank_order), `order` in mesh order."""

    key: tuple[Any, ...]  # identity shared by every member: ("world",) or (creation counter, ranks)
    ranks: tuple[int, ...]
    order: tuple[int, ...]
    desc: str = field(default="undefined", compare=False)  # torch's group_desc

    def group_rank(self, rank: int) -> int:
        return self.ranks.index(rank) if rank in self.ranks else -1


@dataclass(frozen=True)
class Call:
    """A call that blocks until every member of its group reaches the same call."""

    kind: str  # "create" or a collective name
    key: tuple[Any, ...]  # group identity (+ per-group sequence number for collectives)
    members: tuple[int, ...]
    step: int
    detail: tuple[Any, ...] = ()  # what must also agree (collective numel/src)
    context: tuple[Any, ...] | None = field(default=None, compare=False)  # (mesh handle, dim) it was made along

    def describe(self) -> str:
        if self.kind == "create":
            return f"new_group({list(self.members)}) #{self.key[0]}"
        return f"{self.kind} on group {list(self.members)}"


@dataclass(eq=False)
class MeshModel:
    layout: L.Layout
    rank_map: tuple[int, ...]
    names: tuple[str, ...] | None
    root: MeshModel | None
    rank: int
    groups: list[Group] = field(default_factory=list)  # this rank's group per dim ([] when not a member)
    flatten_mapping: dict[str, MeshModel] = field(default_factory=dict)
    view: Any = None  # the `mesh` property: nested ranks, or an Err
    coordinate: tuple[int, ...] | None = None
    creation_quirk: Quirk | None = None  # torch built it although it should have refused
    device: str = "cpu"
    backend_ready: bool = True  # False: built with _init_backend=False and never given groups
    preserve: bool = False  # preserve_rank_order (2.15): each dim's group in mesh order; derived meshes inherit it
    platform: Platform = CPU  # the torch it lives in (what its DTensors' steps do follows its release)
    root_dims: tuple[int, ...] = ()  # a flattened mesh's dims in its root, where torch 2.9 keeps them by name

    @property
    def root_mesh(self) -> MeshModel:
        return self.root if self.root is not None else self

    @property
    def shape(self) -> tuple[int, ...]:
        return L.sizes_of(self.layout)

    @property
    def ndim(self) -> int:
        return len(self.layout)

    def given(self, groups: list[Group]) -> MeshModel:
        """The mesh with its dims' groups set after construction (torch sets _dim_group_names)."""
        self.groups = list(groups)
        self.backend_ready = True
        return self

    def same_as(self, other: MeshModel) -> bool:
        """torch's DeviceMesh.__eq__ (and its hash key): same rank map, layout, device type and names."""
        return (self.rank_map == other.rank_map and self.layout == other.layout and self.names == other.names
                and self.device == other.device and self.preserve == other.preserve)


def summary(mesh: MeshModel) -> Any:
    """What a rank observes of a mesh: shape, names, its coordinate and the mesh tensor (torch's side where torch
    built a mesh it should have refused)."""
    obs = {
        "shape": list(mesh.shape),
        "ndim": mesh.ndim,
        "names": list(mesh.names) if mesh.names else None,
        "coordinate": list(mesh.coordinate) if mesh.coordinate is not None else None,
        "mesh": mesh.view,
    }
    if mesh.creation_quirk is not None:
        return Quirk(mesh.creation_quirk.right, obs, mesh.creation_quirk.finding)
    return obs


def names_out_of_order(mesh: MeshModel, names: tuple[str, ...], flattened: dict[str, MeshModel]) -> Any:
    """torch 2.9's order check of a slice: each name's dim in the mesh (a flattened name's last dim in the root)
    after the one before it, else KeyError; where the names' dims are distinct (a permutation, as the docstring's
    mesh_3d["cp", "dp"]), that is finding slice-order-docstring. None: in order."""
    dims = [(mesh.names.index(n),) if mesh.names and n in mesh.names else flattened[n].root_dims for n in names]
    if all(a[-1] < b[-1] for a, b in zip(dims, dims[1:])):
        return None
    refused = Err("KeyError", "Invalid mesh_dim_names")
    flat = [d for ds in dims for d in ds]
    return Quirk(refused, refused, "slice-order-docstring") if len(set(flat)) == len(flat) else refused
