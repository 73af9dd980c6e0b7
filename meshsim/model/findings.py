"""Findings: where torch's DeviceMesh disagrees with its docs, or is itself wrong, on the versions listed.

The model predicts the right value *and* torch's value for each of these. An observation equal to torch's
value is reported as the finding (not a failure, unless the run is strict); anything else that differs from
the model is a failure. A finding whose version range excludes the running torch is not excused.
"""

from __future__ import annotations

import functools
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MEASURED = Path(__file__).with_name("findings-measured.toml")  # written by `python bench/releases.py findings`
# Set while that script measures where findings hold: the judge then excuses every finding on every release,
# so that a scenario's run says whether torch still does what the finding describes, whatever its range says.
MEASURING = "MESHSIM_MEASURE_FINDINGS"


@dataclass(frozen=True)
class Finding:
    id: str
    title: str
    kind: str  # "docs-vs-code" | "torch-wrong" | "torch-inconsistent"
    detail: str
    since: str  # first torch version it is known on (inclusive)
    until: str | None = None  # first version known fixed (exclusive), None when still present
    verified_on: tuple[str, ...] = ("2.13.0",)  # by hand, where no scenario measures it (see `measured`)
    fixed_with: str | None = None  # how a release lets a program opt out of it: "in 2.15 with ..."
    fix_scenario: str | None = None  # the scenario that shows the way out (bench/releases.py measures it)
    unmeasurable: str | None = None  # why no scenario can show it (it is then verified by hand)

    def applies(self, version: str) -> bool:
        v = _parse(version)
        return v >= _parse(self.since) and (self.until is None or v < _parse(self.until))

    @property
    def measured(self) -> dict[str, str]:
        """Release -> what its scenario showed there (holds, fixed, differs, n/a): measured, not declared."""
        return dict(_measurements().get(self.id, {}).get("releases", {}))

    def versions_text(self) -> str:
        """'holds on 2.9.1-2.15.0', 'holds on 2.9.1; fixed on 2.10.0-2.15.0', or the hand-verified list."""
        runs: list[tuple[str, list[str]]] = []  # consecutive releases alike
        for release, state in sorted(self.measured.items(), key=lambda kv: _parse(kv[0])):
            if runs and runs[-1][0] == state:
                runs[-1][1].append(release)
            else:
                runs.append((state, [release]))
        if not runs:
            return f"verified by hand on {', '.join(self.verified_on)}"
        return "; ".join(f"{state} on {_span(releases)}" for state, releases in runs)


def _span(releases: list[str]) -> str:
    return releases[0] if len(releases) == 1 else f"{releases[0]}-{releases[-1]}" if len(releases) > 2 \
        else ", ".join(releases)


@functools.cache
def _measurements() -> dict[str, dict[str, Any]]:
    try:
        with open(MEASURED, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}


def _parse(version: str) -> tuple[int, ...]:
    core = version.split("+")[0]
    parts = []
    for piece in core.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


REGISTRY: dict[str, Finding] = {
    f.id: f
    for f in (
        Finding(
            "slice-order-docstring", "Slicing in non-ascending order raises, though the docstring shows it working",
            "docs-vs-code",
            'DeviceMesh.__getitem__\'s docstring says mesh_3d["cp", "dp"] returns [[0, 4], [1, 5]]; the code '
            'raises KeyError("Mesh dim indices should be in ascending order"). meshsim expects the KeyError.',
            since="2.4.0",
        ),
        Finding(
            "group-rank-order", "Group ranks are sorted, so group rank != mesh coordinate on non-monotonic layouts",
            "torch-wrong",
            "new_group sorts its ranks, so for a mesh laid out as [[7,6,5,4],[3,2,1,0]] get_local_rank(d), "
            "get_process_group_ranks, all_gather order and the broadcast source follow sorted rank order, not "
            "the mesh's coordinate along d (which get_coordinate() reports). DTensor shards by group rank, so "
            "rank 3 at coordinate 0 of mesh [3,2,1,0] holds chunk 3. Right: group order = mesh order.",
            since="2.2.0", fixed_with="in 2.15 with preserve_rank_order=True",
            fix_scenario="scenarios/fixes/preserve-rank-order.toml",
        ),
        Finding(
            "dtensor-chunk-by-group-rank",
            "DTensor moves shards in group-rank order but places them by mesh coordinate: wrong values, silently",
            "torch-wrong",
            "On a mesh whose dim groups are not in ascending rank order (DeviceMesh('cpu', [[0, 1], [3, 2]]), "
            "[1, 0], a permuted layout), distribute_tensor scatters chunk i to group rank i (new_group sorts "
            "ranks) while the DTensor's offsets, the unpadding and Replicate -> Shard use the mesh coordinate. "
            "With uneven shards full_tensor() returns padding zeros in place of data (arange(3) on [1, 0] comes "
            "back [0, 0, 2]); with even shards Replicate -> Shard then full_tensor() permutes the tensor "
            "([2, 3, 0, 1]); from_local(run_check=True) broadcasts Replicate dims from the lowest rank, not "
            "coordinate 0. Right: DTensor's collectives in mesh-coordinate order. Root cause: group-rank-order.",
            since="2.9.0", fixed_with="in 2.15 with preserve_rank_order=True",
            fix_scenario="scenarios/fixes/preserve-rank-order.toml",
        ),
        Finding(
            "dtensor-local-not-contiguous",
            "Uneven Shard -> Shard and Partial -> Shard redistributes leave a non-contiguous local tensor",
            "torch-inconsistent",
            "distribute_tensor and (since the fix for pytorch/pytorch#173041) Shard -> Replicate make the unpadded "
            "local tensor contiguous, but Shard(a) -> Shard(b) (all_to_all) and Partial -> Shard(b) (reduce_scatter) "
            "with b > 0 and uneven sizes still unpad with narrow() and return the view: .view() on it fails. "
            "A known class (#173041, #143748); these two paths are not named on the trackers. Before torch 2.13, "
            "Shard -> Replicate (full_tensor) left the view too.",
            since="2.9.0",
        ),
        Finding(
            "flatten-outside-the-mesh-fails",
            "_flatten() raises UnboundLocalError on a rank outside the mesh",
            "torch-wrong",
            "_MeshEnv.create_flatten_mesh builds a DeviceMesh for every group of the flattened dim and keeps the one "
            "holding the current rank; a rank in none of them (a mesh smaller than the world) reaches "
            "`res_flattened_mesh` unassigned. Right: a mesh that does not hold the rank, as every other mesh "
            "operation returns (coordinate None). Fixed by the layout rewrite of 2.10.",
            since="2.4.0", until="2.10.0", verified_on=("2.9.1",),
        ),
        Finding(
            "dtensor-sum-linear-over-other-partials",
            "torch.sum of a DTensor that is Partial(max|min|avg) sums the partial values: wrong results, silently",
            "torch-wrong",
            "The reduction strategy treats sum as linear over any Partial, so a Partial(max) input stays Partial "
            "(max) and each rank sums its own unreduced values: full_tensor() is the max of the ranks' sums, not "
            "the sum of the tensor. Right: reduce that Partial first (torch 2.10 replicates it, 2.14 picks the "
            "cheapest legal placement).",
            since="2.9.0", until="2.10.0", verified_on=("2.9.1", "2.10.0"),
        ),
        Finding(
            "unflatten-name-check-inverted", "_unflatten refuses every dim named by a name the mesh has",
            "torch-wrong",
            "DeviceMesh._unflatten(dim, sizes, names) takes its dim as an index or a name; torch 2.10 and 2.11 check "
            "a name with `dim in mesh_dim_names` where they mean `not in`, so mesh._unflatten('tp', ...) raises "
            "ValueError \"dim tp specified in `_unflatten` is not in ('dp', 'tp')\", and a name the mesh lacks "
            "gets past the check to fail at tuple.index. Right: unflatten the named dim, as an index does. Fixed in "
            "2.12.",
            since="2.10.0", until="2.12.0", verified_on=(),
        ),
        Finding(
            "dtensor-merged-collective-on-flattened-mesh",
            "Redistributes merged onto a flattened mesh lose data on uneven shards and permute it where the "
            "flattened group's rank order is not the mesh's",
            "torch-wrong",
            "When the root holds a flattened mesh over some dims (m._flatten()), DTensor.redistribute merges "
            "consecutive all_gathers, all_reduces or reduce_scatters on those dims into one collective on the "
            "flattened group (_optimize_transform_infos). (1) An all_gather is merged whatever the sizes: a [5] "
            "tensor as [S(0), S(0)] on 2x2 holds nested chunks 2/1/1/1, the flat all_gather pads them as chunks "
            "2/2/1/0, and full_tensor() returns padding zeros in place of data (reduce_scatter checks evenness; "
            "all_gather does not). Known: open PR pytorch/pytorch#194457. (2) The flattened group's ranks are "
            "sorted, so on a mesh whose flattened order is not ascending (DeviceMesh('cpu', [[0, 2], [1, 3]]), "
            "whose every dim group is ascending) the merged all_gather concatenates and the merged reduce_scatter "
            "hands out chunks in sorted-rank order, not mesh order: full_tensor() of arange(4) as [S(0), S(0)] "
            "returns [0, 2, 1, 3], and ranks 1 and 2 swap their reduce_scatter chunks. Not on the trackers "
            "(searched: flattened mesh collective rank order, merged reduce_scatter non-monotonic layout). "
            "Right: merge only where the flat collective equals the nested ones.",
            since="2.11.0",
        ),
        Finding(
            "dtensor-merge-lookup-refuses-unsorted-mesh",
            "A redistribute on a mesh whose dims are out of the root's order raises KeyError while torch plans a "
            "merge it would not make",
            "torch-wrong",
            "Before it merges a run of two or more all_gathers, all_reduces or reduce_scatters on several mesh dims "
            "into one collective (_optimize_transform_infos), torch looks for a flattened mesh of those dims by "
            "slicing the mesh by their names (_get_flattened_mesh_by_layout -> _get_slice_mesh_layout), and that "
            "slice refuses dims whose layouts are not in the root's order. A mesh that puts a later root dim first "
            "(DeviceMesh._concatenate([m['cp'], m['dp']]) of a ('dp', 'tp', 'cp') root) is such a mesh, so "
            "full_tensor() of a [S(0), S(0)] DTensor on it raises KeyError(\"Invalid mesh_dim_names ('cp', 'dp') "
            "specified. Mesh dim indices should be in ascending order.\") on every rank, whether or not the root "
            "has any flattened mesh; the same DTensor on the mesh in root order gathers. Found by meshsim's sweep. "
            "Not on the trackers (searched: redistribute KeyError ascending order _get_flattened_mesh_by_layout; "
            "pytorch/pytorch#174006 mends an IndexError of the same lookup on unflattened meshes). Right: a lookup "
            "that cannot find a flattened mesh keeps the collectives apart.",
            since="2.11.0",
        ),
        Finding(
            "from-group-groups-contradict-mesh",
            "DeviceMesh.from_group takes n-D groups that contradict the mesh it is given",
            "torch-wrong",
            "DeviceMesh.from_group([g0, g1], mesh=layout, mesh_dim_names=...) checks only that there is one group "
            "per dim; it does not check that each group is this rank's line of `layout` along that dim. Given "
            "groups along the other dim (or of another mesh), get_coordinate() and the DTensor's offsets follow "
            "`layout` while get_local_rank and every collective, DTensor's included, follow the groups: on 2x2 "
            "with layout [[0, 1], [2, 3]] and dim 0 given the row groups, rank 1 reports coordinate [0, 1] and "
            "local rank 1 on dim 0, and distribute_tensor(arange(4), [S(0), R]) leaves it [2, 3] at offset 0. "
            "Not on the trackers (searched: from_group mesh groups mismatch validation). Right: refuse groups "
            "whose ranks are not the mesh's lines.",
            since="2.4.0",
        ),
        Finding(
            "from-local-run-check-world",
            "DTensor.from_local(run_check=True) on a mesh that leaves ranks out hangs",
            "torch-wrong",
            "run_check's check_tensor_meta calls all_gather_object over the default group, not the mesh's groups, "
            "while ranks outside the mesh return before it: on DeviceMesh('cpu', [2]) in a world of 8, rank 2 "
            "waits in that all_gather forever. It also compares shapes across meshes that share nothing. Right: "
            "gather the metadata within the mesh. Not on the trackers (searched: from_local run_check hang "
            "submesh, check_tensor_meta all_gather_object default group).",
            since="2.5.0",
        ),
        Finding(
            "repeated-rank-accepted", "An explicit mesh that names a rank twice is not rejected",
            "torch-inconsistent",
            "DeviceMesh('cpu', [[0, 1], [1, 2]]) is accepted: one rank raises 'Each device mesh dimension should "
            "get only one process group' while the others go on building groups that rank never joins, so the "
            "run derails. Right: every rank rejects the mesh.",
            since="2.2.0",
        ),
        Finding(
            "devicemesh-names-unchecked", "DeviceMesh(...) does not check mesh_dim_names",
            "torch-inconsistent",
            "init_device_mesh rejects repeated names and a names/shape length mismatch; DeviceMesh(...) "
            "accepts repeated names (slicing then finds the first) and a longer tuple, and fails with "
            "IndexError on a shorter one after creating some groups. Right: the same checks as init_device_mesh.",
            since="2.2.0",
        ),
        Finding(
            "unflatten-duplicate-names", "_unflatten accepts names that repeat the mesh's other dim names",
            "torch-inconsistent",
            "mesh._unflatten(d, sizes, names) does not check the resulting mesh_dim_names for repeats; the mesh "
            "it returns cannot address the shadowed dim by name. Right: reject, as init_device_mesh does.",
            since="2.9.0",
        ),
        Finding(
            "unflatten-bare-assertion", "_unflatten of a non-contiguous flattened dim fails with a bare AssertionError",
            "torch-wrong",
            "On a (2, 2, 3) mesh, m['a', 'c']._flatten() enumerates positions [0, 1, 2, 6, 7, 8]; _unflatten(0, "
            "(3, 2), ...) cannot be laid out and torch raises AssertionError() with no message from its layout "
            "algebra. Right: a ValueError that says the sizes cut across the flattened dims.",
            since="2.9.0",
        ),
        Finding(
            "get-group-name-shadowed-by-flatten",
            "get_group(name) prefers the root's flattened dims over the mesh's own",
            "torch-wrong",
            "get_group/get_local_rank look a name up in the root mesh's _flatten_mapping before the mesh's own "
            "dims, so a mesh whose dim shares a name with a flattened dim of its root answers with the "
            "flattened group. Right: the mesh's own dim.",
            since="2.9.0",
        ),
        Finding(
            "group-name-collision", "Flatten/unflatten of a mesh whose ranks differ across ranks crosses groups",
            "torch-inconsistent",
            "A mesh built with DeviceMesh.from_group(subgroup) holds different ranks on different ranks (ranks "
            "0-3 see [0,1,2,3], ranks 4-7 see [4,5,6,7]). _unflatten/_flatten of it make new_group calls for "
            "different rank sets that get the same group name on every rank; gloo's store rendezvous is keyed "
            "by that name, so the groups cross: the run hangs, or collectives reach the wrong peers. "
            "Seen with from_group(mesh['tp'].get_group()) then _unflatten(0, (2, 2), ...) on 2x4. Right: the "
            "groups of each replica are created so that they do not collide, or the call is refused.",
            since="2.9.0",
        ),
        Finding(
            "gloo-size-mismatch-silent", "gloo all_reduce with different tensor sizes across ranks is not refused",
            "torch-wrong",
            "Ranks passing tensors of different sizes to one all_reduce (or to DTensor's collectives: blocks "
            "from_local infers different global shapes from, or run_check broadcasts) on gloo are not told. "
            "Measured on a "
            "4-rank group where one rank passes n elements and the others 8: n = 5 or 7 return wrong sums on "
            "some ranks (e.g. [1,2,1,0,0,0,0,1]) and the rest hang; n <= 4 hang; n >= 9 abort a process "
            "(gloo::EnforceNotMet 'Received data size doesn't match expected size'). "
            "TORCH_DISTRIBUTED_DEBUG=DETAIL catches it at a cost. Right: an error on every rank.",
            since="2.0.0",
        ),
        Finding(
            "unflatten-negative-dim", "_unflatten(-1, ...) keeps the last dim instead of replacing it",
            "torch-wrong",
            "_unflatten splices the new dims in with layout[dim:dim + 1] and names[dim:dim + 1]; for dim=-1 that "
            "slice is empty, so the old last dim stays next to its parts and DeviceMesh refuses the overlapping "
            "layout: mesh_2x4._unflatten(-1, (2, 2), ('c', 'd')) raises 'AssertionError: Please use a "
            "non-overlapping layout'. Other negative dims work. Right: a (2, 2, 2) mesh named a, c, d.",
            since="2.9.0",
        ),
        Finding(
            "concatenate-duplicate-names", "_concatenate accepts meshes whose dim names repeat",
            "torch-inconsistent",
            "DeviceMesh._concatenate([m['a'], u['a']]) of orthogonal dims that share a name returns a mesh with "
            "mesh_dim_names ('a', 'a'); the second dim cannot be addressed by name. Right: refuse it, as "
            "init_device_mesh refuses repeated names.",
            since="2.9.0",
        ),
        Finding(
            "from-group-names-unchecked", "DeviceMesh.from_group accepts more names than dims",
            "torch-inconsistent",
            "from_group(one_group, names=('x', 'y')) builds a 1-D mesh named x and y; slicing it then fails with "
            "AssertionError 'The number of dim_group_names and mesh_dim_names should have the same length' (or "
            "IndexError for the name past the end). Right: refuse the names when the mesh is built.",
            since="2.9.0",
        ),
        Finding(
            "get-group-foreign-flattened-name",
            "A submesh answers get_group(name) for a flattened dim it does not have",
            "docs-vs-code",
            "After m._flatten('f'), m['c'].get_group('f') returns the flattened group although 'f' is not a dim "
            "of m['c'] (get_group looks names up in the root's _flatten_mapping first); its mesh_dim_names and "
            "the docs say the valid names are its own. Right: KeyError, as for any other name it lacks.",
            since="2.9.0",
        ),
        Finding(
            "mesh-shape-divergence-hangs",
            "Ranks that build different mesh shapes are not told; some finish, others hang",
            "torch-inconsistent",
            "When one rank calls init_device_mesh('cpu', (4, 1)) and the others (2, 2), that rank creates its "
            "groups and returns while the others wait forever inside init_device_mesh for groups it never joins. "
            "The docstring only warns that this 'may lead to hanging'. Right: every rank fails (the group "
            "rendezvous can see the ranks disagree), or every rank waits.",
            since="2.2.0",
            unmeasurable="a hang: its report is the hang's diagnosis (inconsistent mesh), not a finding on a step",
        ),
        Finding(
            "unflatten-docstring-example", "The _unflatten docstring example does not run",
            "docs-vs-code",
            "The docstring unflattens an 8-rank 1-D mesh with _unflatten(0, (2, 2, 4), ['dp', 'pp', 'tp']) and "
            "shows a (2, 2, 2) mesh named ('dp', 'cp', 'tp'). The sizes multiply to 16, not 8, so torch raises "
            "ValueError; neither the shape nor the names of the shown result match the call. Known: an open "
            "docs PR, pytorch/pytorch#190298, fixes the sizes (not the names).",
            since="2.9.0",
        ),
        Finding(
            "recipe-2d-setup-single-host", "The recipe's 2-D setup without DeviceMesh works on one host only",
            "docs-vs-code",
            "The DeviceMesh recipe says its 2d_setup.py snippet 'can also be used when running on multi hosts "
            "setup'. It sizes the groups by torch.cuda.device_count() (the GPUs of one host) and calls "
            "torch.cuda.set_device(rank) with the global rank: on 2 hosts x 4 GPUs, ranks 4-7 fail with 'invalid "
            "device ordinal' (`meshsim launch --nnodes 2 --nproc-per-node 4 2d_setup.py`), and with "
            "set_device(LOCAL_RANK) instead they join no shard or replicate group. Right: LOCAL_RANK for the "
            "device, WORLD_SIZE for the groups, or init_device_mesh.",
            since="2.2.0",
            unmeasurable="a script run under meshsim launch (meshsim examples), not a plan",
        ),
        Finding(
            "dtensor-indexed-device-type",
            "DTensor ops whose sharding strategy costs a redistribution fail on a DeviceMesh('cpu:0', ...)",
            "torch-inconsistent",
            "DeviceMesh accepts a device type with an index ('cpu:0'; init_device_mesh refuses it), and DTensor "
            "works on such a mesh until an op's sharding strategy prices a redistribution: torch.sum of a "
            "Partial(avg|max|min) fails on every rank with \"'NoneType' object has no attribute 'device_count'\" "
            "(MeshTopoInfo.build_from_mesh asks torch.<device_type> for its device count); from 2.14 a sum of "
            "any placement but Replicate fails so on the mesh's members (rule sum-prices-every-strategy). "
            "Right: the same values as on DeviceMesh('cpu', ...), or the mesh refused up front. Related: "
            "pytorch/pytorch#178550 (num_devices_per_host has no handler for non-physical devices).",
            since="2.9.0",
        ),
        Finding(
            "localtensormode-not-an-oracle", "LocalTensorMode disagrees with real ranks on irregular rank maps",
            "torch-inconsistent",
            "torch.distributed._local_tensor.LocalTensorMode answers get_local_rank with the mesh coordinate; "
            "real ranks answer with the index in the sorted group. On [[0,1,2,5],[4,3,6,7]] it says rank 3 has "
            "tp local rank 1 where rank 3 itself gets 0. It cannot stand in for real ranks; meshsim uses them.",
            since="2.9.0",
            unmeasurable="LocalTensorMode against real ranks (tests/test_cluster.py), not a plan",
        ),
    )
}


def get(finding_id: str) -> Finding:
    return REGISTRY[finding_id]


def applies(finding_id: str, version: str) -> bool:
    finding = REGISTRY.get(finding_id)
    return finding is not None and (finding.applies(version) or bool(os.environ.get(MEASURING)))
