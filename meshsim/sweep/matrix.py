"""The matrix plans a sweep runs first, whatever its seed: every cell of the redistribute matrix, every kind of
derived mesh, the conditions redistributes run under, and DTensor's and DeviceMesh's edges (each plan keeps the
steps the installed torch has)."""

from __future__ import annotations

from ..ops.validate import runnable
from ..spec.plan import Plan, Step, step


def factorisations(world: int) -> list[tuple[int, ...]]:
    """Shapes of two or three dims whose product is the world, size-1 dims among them."""
    divisors = [n for n in range(1, world + 1) if world % n == 0]
    shapes: set[tuple[int, ...]] = {(a, world // a) for a in divisors}
    shapes |= {(a, b, world // (a * b)) for a in divisors for b in divisors if world % (a * b) == 0}
    return sorted(shapes)


def matrix_plans(world: int) -> list[Plan]:
    """Plans that produce and check every cell of the redistribute matrix and every kind of derived mesh at
    least once: a sweep runs them first, so its reach does not hang on what the draws happen to hit. For each
    position and source placement, a source redistributed to Replicate and to a Shard there, the Shard moved to
    another tensor dim and gathered, on shapes that do not divide the mesh."""
    two = [s for s in factorisations(world) if len(s) == 2 and s[0] > 1 and s[1] > 1]
    three = [s for s in factorisations(world) if len(s) == 3 and min(s) > 1]
    where = [([world], 0)]  # (mesh shape, mesh dim): a 1-D mesh's dim, an outer, an inner and a middle one
    where += [(list(two[0]), 0), (list(two[0]), 1)] if two else []
    where += [(list(three[0]), 1)] if three else []
    out = []
    for shape in dict.fromkeys(tuple(shape) for shape, _ in where):  # one plan a mesh: its cells share it
        dims = [d for s, d in where if tuple(s) == shape]
        out.append(runnable(_cells(list(shape), dims)))
    if two:
        out.append(runnable(_identity(list(two[0]))))
        out.append(runnable(_caches_keyed_by_meshes(list(two[0]))))
        out.append(runnable(_distribute_sources(list(two[0]))))
        out.append(runnable(_run_check_mixes(list(two[0]))))
    deep = list(three[0]) if three else [two[0][0], 1, two[0][1]] if two else None
    if deep is not None:
        out.append(runnable(_derived_again(deep)))
        for op in ("sum", "avg", "max", "min"):
            out.append(runnable(_merges(deep, op)))
    if two:
        out.append(runnable(_every_derived_mesh(list(two[0]))))
        out.append(runnable(_conditions(list(two[0]))))
        out.append(runnable(_dtensor_edges(list(two[0]))))
        out.append(runnable(_device_mesh_edges(list(two[0]))))
    out.append(runnable(_layout_edges()))
    return out


def _layout_edges() -> list[Step]:
    """The layout algebra under DeviceMesh at its edges: a size-1 dim (torch keeps no mode for it), and the
    non-overlap check on layouts whose sorted dims differ in size, two and three of them (with gaps: torch coalesces
    contiguous dims into one), overlapping or not (a permuted row-major layout, which the draws mostly make, is
    orthogonal whichever sizes the check compares)."""
    asked = [("sizes_and_strides", [1], [3]), ("sizes_and_strides", [2, 1], [1, 4]),
             ("check_orthogonal", [2, 3], [3, 1]), ("check_orthogonal", [2, 3, 2], [24, 4, 1]),
             ("check_orthogonal", [3, 2], [4, 1]), ("check_orthogonal", [4, 2], [1, 1]),
             ("check_orthogonal", [2, 3], [2, 1]), ("check_sorted", [2, 3], [1, 2])]
    return [step("layout", what=what, sizes=sizes, strides=strides) for what, sizes, strides in asked]


def _cells(shape: list[int], dims: list[int]) -> list[Step]:
    """Every source placement's cells at each of `dims`, on one mesh: a cell's checks do not need a mesh of their
    own, and building one per cell was a quarter of what the ranks spent on the matrix."""
    names = [f"d{i}" for i in range(len(shape))]
    steps = [step("init_device_mesh", shape=shape, names=names, out="m")]
    for d in dims:
        for kind in ("R", "S", "P(sum)", "P(avg)", "P(max)", "P(min)"):
            steps += _cell_steps(shape, d, kind, f"_{d}{kind[0]}{kind[2:-1]}")
    return steps


def _cell_steps(shape: list[int], d: int, kind: str, tag: str) -> list[Step]:
    """One source placement at mesh dim `d` of mesh "m": made, redistributed to Replicate and to a Shard there, the
    Shard moved to another tensor dim, then taken out; its handles end in `tag`."""
    t, r, s, u = (f"{name}{tag}" for name in "trsu")
    steps = []
    placements = ["R"] * len(shape)
    placements[d] = "S(0)" if kind == "S" else kind
    if kind.startswith("P"):
        steps.append(step("from_local", mesh="m", local_shape=[3, 2], placements=placements, out=t))
    else:
        steps.append(step("distribute", mesh="m", shape=[shape[d] + 1, 3], placements=placements, out=t))
    if kind == "P(sum)" and len(shape) > 1:
        placements[1 - d] = "P(avg)"  # torch 2.13 lets sum and avg Partials share a DTensor
    to_r, to_s, moved = list(placements), list(placements), list(placements)
    to_r[d], to_s[d], moved[d] = "R", "S(1)" if kind == "S" else "S(0)", "S(0)" if kind == "S" else "S(1)"
    steps += [step("redistribute", tensor=t, placements=to_r, out=r),
              step("redistribute", tensor=t, placements=to_s, out=s),
              step("redistribute", tensor=s, placements=moved, out=u),
              step("to_local", tensor=u), step("full_tensor", tensor=u)]
    return steps


def _conditions(shape: list[int]) -> list[Step]:
    """Redistributes under the conditions meshsim.sweep.produced counts: merged onto a flattened root, nested and
    uneven shards, on a derived mesh with a size-1 dim, and the root derived again afterwards."""
    a, b = shape
    return [step("init_device_mesh", shape=[a, 1, b], names=["a", "one", "b"], out="m"),
            step("flatten", src="m", out="f"),
            step("distribute", mesh="m", shape=[a * b + 1], placements=["S(0)", "R", "S(0)"], out="t"),
            step("full_tensor", tensor="t"),
            step("from_local", mesh="m", local_shape=[a * b], placements=["P(sum)", "R", "P(avg)"], out="p"),
            step("redistribute", tensor="p", placements=["R", "R", "R"], out="q"), step("to_local", tensor="q"),
            step("redistribute", tensor="p", placements=["S(0)", "R", "S(0)"], out="q2"),  # one reduce_scatter
            step("to_local", tensor="q2"),
            step("from_local", mesh="m", local_shape=[a * b + 1], placements=["P(max)", "R", "P(max)"], out="p3"),
            step("redistribute", tensor="p3", placements=["S(0)", "R", "S(0)"], out="q3"),  # uneven: not merged
            step("to_local", tensor="q3"),
            step("slice", src="m", names=["a", "b"], out="s"),
            step("distribute", mesh="s", shape=[b + 1, 2], placements=["S(1)", "S(0)"], out="u"),
            step("redistribute", tensor="u", placements=["R", "S(1)"], out="v"), step("full_tensor", tensor="v"),
            step("unflatten", src="f", dim=0, sizes=[a, b], names=["x", "y"], out="g"),
            step("from_local", mesh="g", tensor="v", placements=["R", "S(1)"], shape=[b + 1, 2], out="w"),
            step("full_tensor", tensor="w")]


def _dtensor_edges(shape: list[int]) -> list[Step]:
    """DTensor's API at its edges: Partial placements distributed, a redistribute that changes nothing (and one to
    a negative Shard dim), from_local
    with a given shape and run_check, a negative Shard dim, torch.sum of Partials it must reduce first, and the
    requests torch refuses (mixed reduce ops, a new Partial, too many placements, a dim the tensor lacks, a
    stride without its shape, a global shape the shards do not add up to)."""
    a, b = shape
    world = a * b
    return [step("init_device_mesh", shape=[world], names=["w"], out="w"),
            step("init_device_mesh", shape=shape, names=["a", "b"], out="m"),
            step("distribute", mesh="m", shape=[b, 3], placements=["P(sum)", "P(avg)"], out="p"),
            step("to_local", tensor="p"),
            step("distribute", mesh="w", shape=[world + 1], placements=["S(0)"], out="t"),
            step("redistribute", tensor="t", placements=["S(0)"], out="same"), step("to_local", tensor="same"),
            step("redistribute", tensor="t", placements=["R"], out="whole"),
            step("redistribute", tensor="whole", placements=["S(-1)"], out="negative"),
            step("to_local", tensor="negative"),
            step("from_local", mesh="w", tensor="t", placements=["S(-1)"], shape=[world + 1], run_check=True,
                 out="given"),
            step("full_tensor", tensor="given"),
            step("from_local", mesh="w", tensor="t", placements=["S(0)"], run_check=True, out="inferred"),
            step("from_local", mesh="m", local_shape=[2, 3], placements=["R", "S(1)"], run_check=True, out="r"),
            step("to_local", tensor="r"),
            step("from_local", mesh="m", local_shape=[2, 3], placements=["P(max)", "S(0)"], out="mx"),
            step("sum", tensor="mx", dim=0, out="s0"), step("to_local", tensor="s0"),
            step("sum", tensor="mx", dim=1, out="s1"), step("to_local", tensor="s1"),
            step("sum", tensor="p", dim=-1, out="s2"), step("to_local", tensor="s2"),
            step("distribute", mesh="m", shape=[3], placements=["R", "R"], out="rr"),
            step("sum", tensor="rr", dim=0, out="s3"), step("to_local", tensor="s3"),
            step("distribute", mesh="m", shape=[b + 1, 5], placements=["S(0)", "S(1)"], out="ss"),
            step("full_tensor", tensor="ss"),
            step("from_local", mesh="m", local_shape=[2], placements=["P(sum)", "P(max)"], out="mixed"),
            step("redistribute", tensor="mx", placements=["P(sum)", "S(0)"], out="np"),
            step("distribute", mesh="m", shape=[3], placements=["R", "R", "R"], out="long"),
            step("distribute", mesh="m", shape=[3], placements=["R", "S(1)"], out="nodim"),
            step("distribute", mesh="w", shape=[4, 2], placements=["S(-3)"], out="negdim"),
            step("from_local", mesh="m", local_shape=[2], placements=["S(0)", "R"], stride=[1], out="nostride"),
            # global shapes the shards do not add up to: more and fewer rows than the gather brings
            step("from_local", mesh="m", local_shape=[2], placements=["S(0)", "R"], shape=[4 * a], out="claimed"),
            step("full_tensor", tensor="claimed"),
            step("from_local", mesh="m", local_shape=[2], placements=["S(0)", "R"], shape=[a], out="fewer"),
            step("full_tensor", tensor="fewer"),
            *_meshes_from_context()]


def _meshes_from_context() -> list[Step]:
    """DTensor's calls that take the mesh from `with mesh:` (a 2-D one inside the 1-D one: the innermost is
    current; the 1-D one alone; the argument inside another's), the current mesh asked inside one, and a call that
    passes none outside any (refused)."""
    return [step("distribute", mesh="m", shape=[5, 2], placements=["S(0)", "R"], mesh_from="context", within="w",
                 out="ctx"),
            step("to_local", tensor="ctx"),
            step("from_local", mesh="w", local_shape=[2], placements=["S(0)"], mesh_from="context", out="ctxl"),
            step("full_tensor", tensor="ctxl"),
            step("distribute", mesh="w", shape=[9], placements=["S(0)"], within="m", out="arg"),
            step("to_local", tensor="arg"),
            step("query", mesh="m", what="current"),
            step("distribute", mesh="m", shape=[3], placements=["R", "R"], mesh_from="none", out="nomesh")]


def _device_mesh_edges(shape: list[int]) -> list[Step]:
    """DeviceMesh's requests at their edges, most of them refused: a dim left out, names that do not exist, slicing
    out of order, unflatten sizes that do not multiply, flatten onto a taken name, from_group without what n
    groups need, backend_override keys that are not dims, a root dim asked of a 2-D mesh; the descriptions its
    groups carry (named, unnamed, flattened: what Flight Recorder dumps and their analyzers read)."""
    a, b = shape
    return [step("init_device_mesh", shape=shape, names=["a", "b"], out="m"),
            step("query", mesh="m", what="get_group"), step("query", mesh="m", what="get_local_rank"),
            step("query", mesh="m", what="root_mesh_dim"), step("slice", src="m", names=["b", "a"], out="x1"),
            step("query", mesh="m", what="group_desc", dim="a"), step("query", mesh="m", what="group_desc", dim="b"),
            step("slice", src="m", names="nope", out="x2"), step("slice", src="m", names=["a", "a"], out="x3"),
            step("unflatten", src="m", dim="b", sizes=[b + 1], names=["u"], out="x4"),
            step("unflatten", src="m", dim=2, sizes=[b], names=["u"], out="x5"),
            step("unflatten", src="m", dim="b", sizes=[b, 1], names=["u"], out="x6"),
            step("flatten", src="m", name="a", out="x7"),
            step("from_group", src="m", dims=[0, 1], layout=list(range(a)), names=["p", "q"], out="x8"),
            *_one_group_meshes(a, b),
            step("from_group", groups=[], out="x9"),
            step("init_device_mesh", shape=shape, names=["a", "b"], backend_override=[[0, "gloo"], ["a", "gloo"]],
                 out="x10"),
            step("init_device_mesh", shape=[a * b], names=["w", "w"], out="x11"),
            step("init_device_mesh", shape=shape, names=["w"], out="x13"),
            step("init_device_mesh", shape=shape, out="unnamed"), step("slice", src="unnamed", names="a", out="x12"),
            step("query", mesh="unnamed", what="group_desc", dim=1),
            step("slice", src="m", names="a", out="sa"), step("slice", src="m", names="b", out="sb"),
            step("concatenate", srcs=["sb", "sa"], out="x14"), step("concatenate", srcs=["sa", "sa"], out="x15"),
            step("init_device_mesh", shape=shape, names=["c", "d"], out="n"),
            step("slice", src="n", names="d", out="nd"),
            step("concatenate", srcs=["sa", "nd"], out="x16"),
            step("flatten", src="m", name="ab", backend="gloo", out="f"),  # (its override given as one backend)
            step("slice", src="sb", names="ab", out="x17"),
            step("query", mesh="sa", what="get_group", dim="ab"), step("query", mesh="f", what="group_desc", dim=0),
            step("query", mesh="m", what="get_group", dim="ab"),
            step("query", mesh="m", what="get_local_rank", dim="ab"),
            step("unflatten", src="f", dim=0, sizes=[a, b], names=["p", "q"], backend_override=[[0, "gloo"]],
                 out="u"), step("check", mesh="u"),
            step("mesh", layout=list(range(a * b)), init_backend=False, out="nb"),
            step("query", mesh="nb", what="get_group"), step("flatten", src="nb", out="x18"),
            step("check", mesh="m")]


def _one_group_meshes(a: int, b: int) -> list[Step]:
    """from_group of one group with mesh= given, as a list and as a tensor: the group's own ranks (taken), and the
    first row's on every rank (refused where that is not the rank's group: a layout that sorts before the group's,
    and one equal to it, both told apart from it)."""
    own = {r: {"layout": list(range(r - r % b, r - r % b + b))} for r in range(b, a * b)}
    out = []
    for as_tensor in (False, True):
        tag = "t" if as_tensor else "l"
        out += [step("from_group", src="m", dims=["b"], layout=list(range(b)), layout_tensor=as_tensor, on_rank=own,
                     out=f"own_{tag}"), step("check", mesh=f"own_{tag}"),
                step("from_group", src="m", dims=["b"], layout=list(range(b)), layout_tensor=as_tensor,
                     out=f"first_{tag}")]
    return out


def _every_derived_mesh(shape: list[int]) -> list[Step]:
    """Each kind of derived mesh made from one root and checked."""
    a, b = shape
    groups = [step("new_group", ranks=list(range(i, a * b, b)), out=f"r{i}") for i in range(b)]  # dim a's lines
    groups += [step("new_group", ranks=list(range(i * b, (i + 1) * b)), out=f"c{i}") for i in range(a)]  # dim b's
    made = [step("init_device_mesh", shape=shape, names=["a", "b"], out="m"), *groups,
            step("slice", src="m", names="a", out="sa"), step("slice", src="m", names="b", out="sb"),
            step("concatenate", srcs=["sa", "sb"], out="c"), step("check", mesh="c"),
            step("flatten", src="m", out="f"), step("check", mesh="f"),
            step("unflatten", src="f", dim=0, sizes=list(shape), names=["x", "y"], out="u"), step("check", mesh="u"),
            step("from_group", src="m", dims=["b"], out="g"), step("check", mesh="g"),
            step("from_group", groups=[[f"r{i}" for i in range(shape[1])], [f"c{i}" for i in range(shape[0])]],
                 layout=[list(range(i * shape[1], (i + 1) * shape[1])) for i in range(shape[0])], names=["x", "y"],
                 out="h"), step("check", mesh="h"),
            step("all_submeshes", src="m", dim="b", out="l"), step("check", mesh="l.0")]
    # after each derived mesh, how many groups the plan has named: a derivation that makes groups it should reuse
    # (or reuses what it should make) shows there
    return [s for st_ in made for s in ((st_, step("group_count")) if st_.op == "check" else (st_,))]


def _identity(shape: list[int]) -> list[Step]:
    """Meshes told apart by one thing each (names, none, layout, shape) and meshes equal by another path (a twin
    root, a flattened root's unflattening, a concatenation of a root's slices), every pair compared (==, hash,
    stable hash, is) and some of their groups along dim 0."""
    a, b = shape
    columns = [[i + a * j for j in range(b)] for i in range(a)]  # ranks laid out column by column
    meshes = [step("init_device_mesh", shape=shape, names=["a", "b"], out="m"),
              step("init_device_mesh", shape=shape, names=["a", "b"], out="twin"),
              step("init_device_mesh", shape=shape, names=["p", "q"], out="renamed"),
              step("init_device_mesh", shape=shape, out="unnamed"),
              step("mesh", layout=columns, names=["a", "b"], out="transposed"),
              step("init_device_mesh", shape=[b, a], names=["a", "b"], out="reshaped"),
              step("flatten", src="m", out="f"),
              step("unflatten", src="f", dim=0, sizes=shape, names=["x", "y"], out="u"),
              step("slice", src="m", names="a", out="sa"), step("slice", src="twin", names="a", out="sa2"),
              step("slice", src="m", names="b", out="sb"), step("concatenate", srcs=["sa", "sb"], out="c")]
    handles = [s.out for s in meshes]
    compared = [step("compare", a=x, b=y) for i, x in enumerate(handles) for y in handles[i + 1:]]
    groups = [step("compare", a=x, b=y, dim_a=0, dim_b=0) for x, y in
              (("m", "twin"), ("m", "c"), ("sa", "sa2"), ("m", "transposed"))]
    return meshes + compared + groups


def _caches_keyed_by_meshes(shape: list[int]) -> list[Step]:
    """The same redistribute of values that tell ranks apart on meshes that differ in one thing, the root first
    (torch merges its moves onto its flattened mesh, and caches the plan by the DTensor's spec, mesh included): a
    cache that mistakes one mesh for another shows in the values."""
    a, b = shape
    columns = [[i + a * j for j in range(b)] for i in range(a)]
    steps = [step("init_device_mesh", shape=shape, names=["a", "b"], out="m"), step("flatten", src="m", out="f"),
             step("init_device_mesh", shape=shape, names=["a", "b"], out="twin"),
             step("init_device_mesh", shape=shape, names=["p", "q"], out="renamed"),
             step("mesh", layout=columns, names=["a", "b"], out="transposed")]
    for handle in ("m", "twin", "renamed", "transposed"):
        steps += [step("from_local", mesh=handle, local_shape=[4, 3], placements=["P(sum)", "P(sum)"],
                       out=f"p_{handle}"),
                  step("redistribute", tensor=f"p_{handle}", placements=["R", "R"], out=f"r_{handle}"),
                  step("redistribute", tensor=f"p_{handle}", placements=["S(0)", "S(0)"], out=f"s_{handle}",
                       async_op=handle == "twin"),
                  step("sum", tensor=f"s_{handle}", dim=1, out=f"v_{handle}")]
    return steps


def _distribute_sources(shape: list[int]) -> list[Step]:
    """distribute_tensor where every rank passes another tensor: each src_data_rank (the default, another group
    rank, none) with every kind of placement, on a root, on a mesh whose group order is not its coordinate order,
    and on a slice; each seen whole and as blocks."""
    a, b = shape
    steps = [step("init_device_mesh", shape=shape, names=["a", "b"], out="m"),
             step("mesh", layout=[[i + a * j for j in range(b)] for i in range(a)], names=["a", "b"], out="t"),
             step("slice", src="m", names="b", out="sb")]
    kinds = (["S(0)", "R"], ["R", "S(1)"], ["S(0)", "S(0)"], ["P(sum)", "R"], ["R", "P(avg)"], ["S(1)", "P(max)"])
    n = 0
    for src in (None, 1, "none"):
        for mesh, placements in [("m", p) for p in kinds] + [("t", kinds[2]), ("t", kinds[3]), ("sb", ["S(0)"])]:
            n += 1
            extra = {} if src is None else {"src_data_rank": src}
            steps += [step("distribute", mesh=mesh, shape=[b + 1, a + 1], placements=placements, out=f"d{n}",
                           **extra), step("full_tensor", tensor=f"d{n}")]
    return steps


def _run_check_mixes(shape: list[int]) -> list[Step]:
    """from_local with run_check on every mix of Shard, Replicate and Partial over two mesh dims (fresh blocks tell
    ranks apart: a broadcast along the wrong dim, or none, shows), the global shape inferred or given."""
    kinds = ("R", "S(0)", "P(sum)")
    steps = [step("init_device_mesh", shape=shape, names=["a", "b"], out="m")]
    n = 0
    for first in kinds:
        for second in kinds:
            n += 1
            given = {"shape": [2 * shape[0] if first == "S(0)" else 2, 3]} if n % 2 else {}
            if given and second == "S(0)":
                given["shape"][0] *= shape[1]
            steps += [step("from_local", mesh="m", local_shape=[2, 3], placements=[first, second], run_check=True,
                           out=f"c{n}", **given), step("full_tensor", tensor=f"c{n}")]
    return steps


def _derived_again(shape: list[int]) -> list[Step]:
    """Every kind of derived mesh flattened, and unflattened again, each checked (groups, local ranks, collectives
    along every dim): a slice of dims that are not adjacent, concatenations (one of three dims in reverse: torch
    checks the result's layout for overlaps), an unflattening, a flattening of a
    flattened mesh. (A mesh from a subgroup is left out: flattening it crosses groups, finding group-name-collision.)"""
    steps = [step("init_device_mesh", shape=shape, names=["a", "b", "c"], out="m"),
             step("slice", src="m", names=["a", "c"], out="ac"), step("flatten", src="ac", out="f_ac"),
             step("check", mesh="f_ac"),
             step("unflatten", src="f_ac", dim=0, sizes=[shape[0], shape[2]], names=["x", "z"], out="u_ac"),
             step("check", mesh="u_ac"), step("flatten", src="u_ac", name="xz", out="f_xz"),
             step("check", mesh="f_xz"), step("compare", a="f_xz", b="f_ac"),
             step("slice", src="m", names="a", out="sa"), step("slice", src="m", names="c", out="sc"),
             step("concatenate", srcs=["sa", "sc"], out="cat"), step("flatten", src="cat", name="cat", out="f_cat"),
             step("check", mesh="f_cat"),
             step("slice", src="m", names="b", out="sb"), step("concatenate", srcs=["sc", "sb", "sa"], out="back"),
             step("check", mesh="back"),
             step("unflatten", src="m", dim="b", sizes=[shape[1], 1], names=["b1", "b2"], out="u_b"),
             step("check", mesh="u_b"), step("flatten", src="u_b", name="ub", out="f_ub"), step("check", mesh="f_ub"),
             step("flatten", src="m", out="f_all"), step("flatten", src="f_all", name="again", out="f_f"),
             step("check", mesh="f_f"),
             step("unflatten", src="f_all", dim=0, sizes=[shape[0] * shape[1], shape[2]], names=["ab", "cc"],
                  out="u_all"), step("check", mesh="u_all"), step("slice", src="u_all", names="cc", out="u_cc"),
             step("compare", a="u_cc", b="sc"), step("check", mesh="m")]
    return [s for st_ in steps for s in ((st_, step("group_count")) if st_.op == "check" else (st_,))]


def _merges(shape: list[int], op: str) -> list[Step]:
    """Partial(op) reduced on mesh dims torch merges onto a flattened mesh (all three, and two that are not
    adjacent), to Replicate and to Shard, for every class of tensor size: divisible by the merged group, uneven,
    smaller than the group, empty."""
    steps = [step("init_device_mesh", shape=shape, names=["a", "b", "c"], out="m"),
             step("flatten", src="m", out="f_all"),
             step("slice", src="m", names=["a", "c"], out="ac"), step("flatten", src="ac", out="f_ac")]
    n = 0
    world = shape[0] * shape[1] * shape[2]
    p = f"P({op})"
    for rows in (2 * world, world + 1, 1, 0):
        for placements, targets in (([p, p, p], (["R", "R", "R"], ["S(0)", "S(0)", "S(0)"], ["S(1)", "R", "R"])),
                                    ([p, "R", p], (["R", "R", "R"], ["S(0)", "R", "S(0)"], ["S(0)", "R", "R"]))):
            n += 1
            steps.append(step("from_local", mesh="m", local_shape=[rows, 2], placements=placements, out=f"p{n}"))
            for k, target in enumerate(targets):
                steps += [step("redistribute", tensor=f"p{n}", placements=target, out=f"q{n}_{k}"),
                          step("full_tensor", tensor=f"q{n}_{k}")]
    return steps
