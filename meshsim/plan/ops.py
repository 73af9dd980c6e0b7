"""The operations a plan may contain, with the fields each one takes.

Every op is pure data: a name, typed fields, and whether it produces a handle. The model and the worker
each interpret the same ops; validation here only checks what a plan *says*, never what torch will do.
"""

from __future__ import annotations

from dataclasses import dataclass

# Field kinds. Each is checked by plan.validate.
SHAPE = "shape"  # list of positive ints
INTS = "ints"  # list of ints
NAMES = "names"  # list of str
NAME_OR_NAMES = "name_or_names"  # str or list of str
NAME = "name"  # str
DIM = "dim"  # int or str
DIMS = "dims"  # list of int or str
LAYOUT = "layout"  # nested rectangular list of ints
MESH = "mesh"  # handle of a mesh
MESHES = "meshes"  # list of mesh handles
GROUP = "group"  # handle of a process group made by new_group
RANKS = "ranks"  # list of world ranks
SECONDS = "seconds"  # non-negative number
INT = "int"
TEXT = "text"
BOOL = "bool"
QUERY = "query"  # one of QUERIES
DEVICE = "device"  # "cpu" or "cuda": a mesh's device type (with the mixed backend a plan can use both)

QUERIES = (
    "get_group",
    "get_all_groups",
    "get_local_rank",
    "get_coordinate",
    "size",
    "shape",
    "ndim",
    "mesh",
    "mesh_dim_names",
)

# What an op leaves behind under its `out` handle.
PRODUCES_MESH = "mesh"
PRODUCES_MESH_LIST = "mesh_list"
PRODUCES_GROUP = "group"


@dataclass(frozen=True)
class OpSpec:
    name: str
    fields: dict[str, str]
    required: tuple[str, ...] = ()
    produces: str | None = None
    creates_groups: bool = False
    doc: str = ""


_COLLECTIVE_FIELDS = {"mesh": MESH, "dim": DIM, "group": GROUP}

OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        OpSpec("init_device_mesh", {"shape": SHAPE, "names": NAMES, "device": DEVICE}, ("shape",), PRODUCES_MESH,
               True, doc="init_device_mesh(device, shape, mesh_dim_names=names); device defaults to the backend's"),
        OpSpec("mesh", {"layout": LAYOUT, "names": NAMES, "device": DEVICE}, ("layout",), PRODUCES_MESH, True,
               doc="DeviceMesh(device, layout, mesh_dim_names=names): explicit ranks, any order, any subset"),
        OpSpec("slice", {"src": MESH, "names": NAME_OR_NAMES}, ("src", "names"), PRODUCES_MESH,
               doc="src[names]"),
        OpSpec("flatten", {"src": MESH, "name": NAME}, ("src",), PRODUCES_MESH, True,
               doc="src._flatten(name)"),
        OpSpec("unflatten", {"src": MESH, "dim": DIM, "sizes": SHAPE, "names": NAMES},
               ("src", "dim", "sizes", "names"), PRODUCES_MESH, True,
               doc="src._unflatten(dim, sizes, names)"),
        OpSpec("concatenate", {"srcs": MESHES}, ("srcs",), PRODUCES_MESH,
               doc="DeviceMesh._concatenate([srcs...])"),
        OpSpec("from_group", {"src": MESH, "dims": DIMS, "group": GROUP, "layout": LAYOUT, "names": NAMES},
               (), PRODUCES_MESH,
               doc="DeviceMesh.from_group(groups of src's dims, or a new_group handle; mesh=layout or src's view)"),
        OpSpec("all_submeshes", {"src": MESH, "dim": NAME}, ("src", "dim"), PRODUCES_MESH_LIST,
               doc="src._get_all_submeshes(dim): handles out.0, out.1, ..."),
        OpSpec("new_group", {"ranks": RANKS}, ("ranks",), PRODUCES_GROUP, True,
               doc="dist.new_group(ranks)"),
        OpSpec("query", {"mesh": MESH, "what": QUERY, "dim": DIM}, ("mesh", "what"),
               doc="one DeviceMesh query: " + ", ".join(QUERIES)),
        OpSpec("check", {"mesh": MESH, "collectives": BOOL}, ("mesh",),
               doc="every query, and all_reduce/all_gather/broadcast along every dim"),
        OpSpec("all_reduce", {**_COLLECTIVE_FIELDS, "numel": INT}, (),
               doc="all_reduce of a one-hot vector (length numel, default world) on a mesh dim or group"),
        OpSpec("all_gather", dict(_COLLECTIVE_FIELDS), (), doc="all_gather of the rank"),
        OpSpec("broadcast", {**_COLLECTIVE_FIELDS, "src": INT}, (), doc="broadcast from group rank src"),
        OpSpec("barrier", dict(_COLLECTIVE_FIELDS), (), doc="barrier on a mesh dim or group"),
        OpSpec("sleep", {"seconds": SECONDS}, ("seconds",), doc="time.sleep(seconds)"),
        OpSpec("raise", {"message": TEXT}, (), doc="raise an exception: this rank's plan ends"),
        OpSpec("exit", {"code": INT}, (), doc="os._exit(code): the rank dies"),
        OpSpec("kill", {}, (), doc="SIGKILL to itself: the rank dies"),
    )
}

COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "barrier")
# Keys every step may carry besides its op's fields.
STEP_KEYS = ("op", "out", "only_on", "skip_on", "on_rank", "expect_error")
