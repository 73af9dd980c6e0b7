"""DeviceMesh's groups rebuilt into meshes from what gloo's dumps say of them (their names and descriptions).

init_device_mesh makes each dim's groups in turn, one new_group per group in the order of the other dims
(row-major), so on gloo (sequential names) a dim's groups have consecutive names and the dims follow each other;
the description of each is mesh_<dim>. Every ordered split of the dims into meshes and every factorization of the
world is tried against what is known of each group's members and names; a unique fit completes the members of
every group. Pure Python, no torch.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from typing import Any

from .records import UNSEEN, Group, Mesh


def name_order(name: str) -> tuple:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def _mesh_dim(desc: str) -> str | None:
    if desc.startswith("mesh_") and desc != "mesh_default":
        return desc[len("mesh_"):]
    return None


def _dim_of(group: Group) -> str:
    """The mesh dim of one of DeviceMesh's groups (only those are asked)."""
    dim = _mesh_dim(group.desc)
    assert dim is not None
    return dim


def meshes_and_world(groups: dict[str, Group], size: int, notes: list[str], fixed: bool) -> tuple[list[Mesh], int]:
    """The meshes, and the world they span. Where nothing names the world (gloo's dumps name no members), the
    highest rank with a dump may not be the last rank: a world a little larger, which the DeviceMesh groups' names
    fit when the smaller one fits nothing, is the job's (its last ranks left no dump).
    Where several layouts fit the smaller world, the dumps cannot tell them apart and no larger world is looked
    for: it would be chosen only because fewer layouts fit it (a mesh dim nobody used, and groups that each show
    one member, fit many)."""
    tried: list[str] = []
    meshes, ambiguous = _infer_meshes(groups, size, tried)
    if meshes or fixed or ambiguous or not any(_mesh_dim(g.desc) for g in groups.values()):
        notes += tried
        return meshes, size
    for larger in range(size + 1, 2 * size + 1):
        meshes, _ = _infer_meshes(groups, larger, [])
        if meshes:
            notes.append(f"the world is {larger}, not the {size} that the dumps' highest rank says: the DeviceMesh "
                         f"groups fit a world of {larger} only")
            return meshes, larger
    return [], size


def _infer_meshes(groups: dict[str, Group], world: int, notes: list[str]) -> tuple[list[Mesh], bool]:
    """DeviceMesh's groups (description mesh_<dim>) as meshes over the world, where exactly one layout fits; and
    whether several did.

    init_device_mesh makes each dim's groups in turn, one new_group per group in the order of the other dims
    (row-major), so on gloo (sequential names) a dim's groups have consecutive names and the dims follow each
    other. Every ordered split of the dims into meshes and every factorization of the world is tried against
    what is known of each group's members and names; a unique fit completes the members of every group.
    """
    mesh_groups = [g for g in groups.values() if _mesh_dim(g.desc) is not None]
    if not mesh_groups:
        return [], False
    numbered = all(g.name.isdigit() for g in mesh_groups)
    blocks: list[tuple[str, list[Group]]] = []  # runs of one dim, in creation order where names tell it
    for g in sorted(mesh_groups, key=lambda g: name_order(g.name)):
        dim = _dim_of(g)
        if blocks and blocks[-1][0] == dim:
            blocks[-1][1].append(g)
        else:
            blocks.append((dim, [g]))
    if not numbered:
        # hashed names (split_group) give no order: one mesh, its dims in whichever order fits
        by_dim: dict[str, list[Group]] = {}
        for g in mesh_groups:
            by_dim.setdefault(_dim_of(g), []).append(g)
        splits = [[list(p)] for p in itertools.permutations(by_dim.items())] if len(by_dim) <= 5 else []
    else:
        splits = list(_splits(blocks))
    taken = frozenset(g.name for g in groups.values())
    fits = [fit for split in splits for fit in _fits(split, world, numbered, taken)]
    if not fits and numbered:
        # a dim nobody called a collective on leaves no trace but the names it used up: try one such dim
        unseen = [[m[:i] + [(UNSEEN, [])] + m[i:] if k == j else m for k, m in enumerate(split)]
                  for split in splits for j in range(len(split)) for i in range(len(split[j]) + 1)]
        fits = [fit for split in unseen for fit in _fits(split, world, numbered, taken)]
    memberships = {_memberships(fit) for fit in fits}
    if len(memberships) != 1:
        dims = sorted({_dim_of(g) for g in mesh_groups})
        why = "no mesh over the whole world fits them" if not fits else f"{len(memberships)} layouts fit them"
        notes.append(f"DeviceMesh groups of dims {dims} are kept as plain groups: {why}")
        return [], len(memberships) > 1
    fits.sort(key=lambda fit: sum(len(shape) for shape, _, _ in fit))
    for shape, names, _ in fits[0]:
        if UNSEEN in names:
            notes.append(f"mesh {tuple(shape)} has a dim no rank made a collective on; its name is unknown, so it "
                         f"is called {UNSEEN!r} here (its groups took the names between the others')")
    meshes: list[Mesh] = []
    chosen: list[Any] = []
    for shape, names, assignment in fits[0]:
        index = len(meshes)
        named = not all(re.fullmatch(r"dim_\d+", n) for n in names if n != UNSEEN)
        if not named:  # torch named the dims by index, so the unseen one's name is known after all
            names = [f"dim_{i}" for i in range(len(names))]
            assignment = {f"dim_{i}": slots for i, slots in enumerate(assignment.values())}
        mesh = Mesh(tuple(shape), tuple(names), named, {})
        chosen.append((shape, names, assignment))
        for dim, expected in assignment.items():
            keys = []
            for _position, (members, group) in enumerate(expected):
                if group is None:
                    continue  # a group no rank recorded anything on, and whose name cannot be known
                group.ranks, group.mesh, group.dim = tuple(members), index, dim
                group.source = group.source if group.source == "pg_config" else "mesh"
                keys.append(group.key)
            mesh.groups[dim] = keys
        meshes.append(mesh)
    _add_unseen_mesh_groups(groups, meshes, chosen, numbered)
    return meshes, False


def _memberships(fit: list) -> frozenset:
    return frozenset((g.key, members) for _, _, assignment in fit for slots in assignment.values()
                     for members, g in slots if g is not None)


def _splits(blocks: list) -> Iterable[list]:
    """Every way to cut the sequence of dim blocks into consecutive meshes."""
    n = len(blocks)
    for cuts in itertools.product((False, True), repeat=max(n - 1, 0)):
        meshes, current = [], [blocks[0]]
        for block, cut in zip(blocks[1:], cuts):
            if cut:
                meshes.append(current)
                current = [block]
            else:
                current.append(block)
        meshes.append(current)
        if all(len({d for d, _ in m}) == len(m) for m in meshes):  # a dim appears once in a mesh
            yield meshes


def _factorizations(n: int, k: int) -> Iterable[tuple[int, ...]]:
    if k == 1:
        yield (n,)
        return
    for first in range(1, n + 1):
        if n % first == 0:
            for rest in _factorizations(n // first, k - 1):
                yield (first,) + rest


def _dim_groups(shape: tuple[int, ...], dim: int) -> list[list[int]]:
    """torch's groups of one dim of a row-major mesh over range(prod(shape)), in the order it makes them."""
    others = [range(s) for i, s in enumerate(shape) if i != dim]
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    out = []
    for coords in itertools.product(*others):
        full = list(coords)
        full.insert(dim, 0)
        base = sum(c * s for c, s in zip(full, strides))
        out.append([base + j * strides[dim] for j in range(shape[dim])])
    return out


def _fits(split: list, world: int, numbered: bool, taken: frozenset = frozenset()) -> list:
    """The layouts (one per mesh: shape, names, dim -> [(members, group or None)]) that fit every group; `taken`:
    the names of every group the dumps show."""
    per_mesh: list[list] = []
    for mesh_blocks in split:
        options = []
        names = [d for d, _ in mesh_blocks]
        for shape in _factorizations(world, len(mesh_blocks)):
            assignment = _assign(shape, mesh_blocks, numbered, taken)
            if assignment is not None:
                options.append((shape, names, assignment))
        if not options:
            return []
        per_mesh.append(options)
    fits = []
    for combo in itertools.product(*per_mesh):
        if numbered and not _names_in_sequence(combo, taken):
            continue
        fits.append(list(combo))
    return fits


def _assign(shape: tuple[int, ...], blocks: list, numbered: bool, taken: frozenset = frozenset()) -> dict | None:
    """Each group of each dim in the place its members fit, or None. With sequential names, a dim's groups hold
    consecutive names: a place no recorded group fills has its name all the same, and a name some other group
    holds (another dim's, or a new_group's) rules the layout out."""
    assignment = {}
    for dim_index, (dim, groups) in enumerate(blocks):
        expected = _dim_groups(shape, dim_index)
        slots: list = [[members, None] for members in expected]
        base = None
        for g in groups:
            exact = g.source == "pg_config"
            matches = [i for i, (members, _) in enumerate(slots)
                       if (set(g.ranks) == set(members) if exact else set(g.ranks) <= set(members))]
            if len(matches) != 1 or slots[matches[0]][1] is not None:
                return None
            i = matches[0]
            if numbered:
                offset = int(g.name) - i
                if base is not None and offset != base:
                    return None
                base = offset
            slots[i][1] = g
        if base is not None and any(g is None and str(base + i) in taken for i, (_, g) in enumerate(slots)):
            return None
        assignment[dim] = [(tuple(m), g) for m, g in slots]
    return assignment


def _names_in_sequence(combo: Any, taken: frozenset = frozenset()) -> bool:
    """Sequential names: each dim's groups start right after the previous dim's, within a mesh and across; an
    unseen dim's groups take the names after the previous dim's, which no other group may hold."""
    previous_end = None
    for _, _, assignment in combo:
        for slots in assignment.values():
            named = [(i, g) for i, (_, g) in enumerate(slots) if g is not None]
            if not named:  # an unseen dim: its groups take the next names
                if previous_end is not None and any(str(n) in taken
                                                    for n in range(previous_end, previous_end + len(slots))):
                    return False
                previous_end = None if previous_end is None else previous_end + len(slots)
                continue
            base = int(named[0][1].name) - named[0][0]
            if previous_end is not None and base < previous_end:
                return False
            previous_end = base + len(slots)
    return True


def _add_unseen_mesh_groups(groups: dict[str, Group], meshes: list[Mesh], fit: list, numbered: bool) -> None:
    """A mesh group nobody recorded a call on still exists, and its members are members: name it where the
    sequential names tell it, so that a rank without a dump shows in every group it belonged to."""
    if not numbered:
        return
    for index, (_shape, _names, assignment) in enumerate(fit):
        for dim, slots in assignment.items():
            named = [(i, g) for i, (_, g) in enumerate(slots) if g is not None]
            if not named:
                continue  # an unseen dim: nothing says which names its groups took
            base = int(named[0][1].name) - named[0][0]
            desc = named[0][1].desc
            keys = []
            for i, (members, g) in enumerate(slots):
                key = str(base + i)
                if g is None and key not in groups:
                    groups[key] = Group(key, key, desc, tuple(members), "mesh", index, dim)
                keys.append(g.key if g is not None else key)
            meshes[index].groups[dim] = keys
    ordered = dict(sorted(groups.items(), key=lambda kv: name_order(kv[1].name)))
    groups.clear()
    groups.update(ordered)
