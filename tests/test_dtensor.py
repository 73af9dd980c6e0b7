"""DTensor checked rank by rank: the model's sharding rules against torch's own, and plans on a running cluster."""

import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim import Cluster, Plan, Topology, step
from meshsim.model import dtensor as D
from meshsim.model.expect import Quirk
from meshsim.model.predict import predict
from meshsim.ops import validate
from meshsim.spec.fields import PlanError
from meshsim.sweep.properties import assert_agrees
from meshsim.sweep.strategies import DTENSOR_COMPOSITIONS, _Builder, plans

# ------------------------------------------------------------------------------------------ the model, pure


@given(st.integers(0, 40), st.integers(1, 9))
def test_chunks_follow_torch_chunk_with_trailing_empty_chunks(size, k):
    want = [c.shape[0] for c in torch.arange(size).chunk(k)] if size else []
    want += [0] * (k - len(want))
    assert [length for _, length in D.chunk_bounds(size, k)] == want
    assert sum(want) == size


@st.composite
def sharded_specs(draw):
    mesh_shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=1, max_size=3)))
    placements = [draw(st.sampled_from([("R",), ("P", "sum")] + [("S", d) for d in range(len(shape))]))
                  for _ in mesh_shape]
    coordinate = tuple(draw(st.integers(0, n - 1)) for n in mesh_shape)
    return mesh_shape, shape, placements, coordinate


def _torch_placement(p):
    from torch.distributed.tensor import Partial, Replicate, Shard

    return Replicate() if p[0] == "R" else Shard(p[1]) if p[0] == "S" else Partial(p[1])


@given(sharded_specs())
def test_local_shape_and_offset_equal_torchs_for_any_placements_and_coordinate(spec):
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    mesh_shape, shape, placements, coordinate = spec
    want = _compute_local_shape_and_global_offset(shape, mesh_shape, list(coordinate),
                                                  [_torch_placement(p) for p in placements])
    got = D.local_shape_and_offset(shape, placements, coordinate, mesh_shape)
    assert (tuple(got[0]), tuple(got[1])) == want


def _mesh_geometry(mesh_shape, order):
    flat = list(range(math.prod(mesh_shape)))
    if order == "reversed":
        flat = flat[::-1]

    def nest(items, dims):
        if len(dims) == 1:
            return items
        step_ = len(items) // dims[0]
        return [nest(items[i * step_:(i + 1) * step_], dims[1:]) for i in range(dims[0])]

    return D.Geometry(nest(flat, mesh_shape), tuple(mesh_shape))


@given(sharded_specs(), st.lists(st.lists(st.sampled_from(["R", "S0", "S1", "S2"]), min_size=3, max_size=3),
                                 max_size=3))
@settings(max_examples=150)
def test_every_redistribute_and_full_tensor_in_coordinate_order_gives_back_the_original(spec, chain):
    mesh_shape, shape, placements, _ = spec
    placements = [p if p[0] != "P" else ("R",) for p in placements]
    geo = _mesh_geometry(mesh_shape, "reversed")
    original = D.arange_block(shape)
    state = D.distribute(geo, dict.fromkeys(geo.flat, original), placements, D.coordinate_order)
    current = placements
    for raw in chain:
        target = [("R",) if t == "R" or int(t[1]) >= len(shape) else ("S", int(t[1])) for t in raw[:len(mesh_shape)]]
        state = D.redistribute(geo, shape, state, current, target, D.coordinate_order)
        current = target
        for rank, block in state.items():
            local, _ = D.local_shape_and_offset(shape, current, geo.coordinate[rank], geo.shape)
            assert list(block.shape) == local
    full = D.redistribute(geo, shape, state, current, [("R",)] * len(mesh_shape), D.coordinate_order)
    assert all(block.values == original.values and block.shape == original.shape for block in full.values())


def test_distribute_sends_the_blocks_of_the_source_rank_on_every_dim_or_keeps_each_ranks_own():
    geo = D.Geometry([[0, 1], [2, 3]], (2, 2))
    tensors = {r: D.arange_block((4,), 100.0 * r) for r in geo.flat}
    for src, want in ((0, 0), (1, 3)):  # the member at coordinate (src, src) is the source of every block
        state = D.distribute(geo, tensors, [("S", 0), ("R",)], D.coordinate_order, src)
        assert [state[r].values for r in (0, 2)] == [(100.0 * want, 100.0 * want + 1), (100.0 * want + 2,
                                                                                        100.0 * want + 3)]
    own = D.distribute(geo, tensors, [("S", 0), ("S", 0)], D.coordinate_order, None)
    assert [own[r].values for r in geo.flat] == [(0.0,), (101.0,), (202.0,), (303.0,)]


def test_group_rank_order_loses_data_on_an_uneven_shard_of_a_reversed_mesh():
    geo = D.Geometry([1, 0], (2,))
    placements = [("S", 0)]
    for order, want in ((D.coordinate_order, (0.0, 1.0, 2.0)), (D.group_rank_order, (0.0, 0.0, 2.0))):
        state = D.distribute(geo, dict.fromkeys(geo.flat, D.arange_block((3,))), placements, order)
        full = D.redistribute(geo, (3,), state, placements, [("R",)], order)
        assert full[0].values == want


def test_nested_shardings_are_unwound_first_only_when_the_source_is_split_in_more_than_one_piece():
    src, dst = [("S", 0), ("P", "sum")], [("R",), ("S", 0)]
    # torch's planner checks src_spec.num_shards > 1: a Shard on a mesh dim of size 1 does not split anything
    assert D.greedy_transforms(src, dst, (1, 4)) == [(0, ("S", 0), ("R",)), (1, ("P", "sum"), ("S", 0))]
    assert D.greedy_transforms(src, dst, (2, 2)) == [(1, ("P", "sum"), ("R",)), (0, ("S", 0), ("R",)),
                                                     (1, ("R",), ("S", 0))]


PARTIAL_TO_SHARD_ON_A_PERMUTED_DIM = Plan((
    step("mesh", layout=[[0, 2, 1, 3]], out="m"),
    step("distribute", mesh="m", shape=[2], placements=["S(0)", "P(sum)"], out="t"),
    step("redistribute", tensor="t", placements=["R", "S(0)"], out="u"),
    step("full_tensor", tensor="u")))  # a README property run drew this: torch reduce-scatters at once


def test_partial_to_shard_beside_a_size_one_shard_is_one_reduce_scatter_in_group_rank_order():
    quirk = predict(PARTIAL_TO_SHARD_ON_A_PERMUTED_DIM, 4).ranks[2].observations[2]
    # rank 0 passes the source tensor (4096 + 0, 1): rank 2 should hold its element 1
    assert isinstance(quirk, Quirk) and quirk.right["values"] == [4097] and quirk.torch["values"] == [0]


def test_the_model_predicts_a_quirk_only_on_a_mesh_with_an_unsorted_group():
    def observed(layout):
        plan = Plan((step("mesh", layout=layout, out="m"),
                     step("distribute", mesh="m", shape=[3], placements=["S(0)"], out="t"),
                     step("full_tensor", tensor="t")))
        return predict(plan, 2).ranks[0].observations[2]

    # each rank passes rank_weight(rank) + 0, 1, 2: the source is the dim's first member (rank 0, then rank 1),
    # torch's its group rank 0 (rank 0 both times)
    assert observed([0, 1]) == {"shape": [3], "values": [4096, 4097, 4098], "contiguous": True}
    quirk = observed([1, 0])
    assert isinstance(quirk, Quirk) and quirk.finding == D.FINDING
    assert quirk.torch["values"] == [4096, 0, 4098] and quirk.right["values"] == [8192, 8193, 8194]


def test_from_local_blocks_tell_ranks_apart_so_a_partial_sum_names_its_members():
    plan = Plan((step("init_device_mesh", shape=[2, 2], names=["a", "b"], out="m"),
                 step("from_local", mesh="m", local_shape=[1], placements=["P(sum)", "R"], out="t"),
                 step("full_tensor", tensor="t")))
    values = [predict(plan, 4).ranks[r].observations[2]["values"] for r in range(4)]
    # dim "a" pairs ranks {0, 2} and {1, 3}: 4096 * (1 + 4) and 4096 * (2 + 8)
    assert values == [[4096 * 5], [4096 * 10], [4096 * 5], [4096 * 10]]


def test_from_local_with_a_stride_and_no_shape_is_refused_on_every_rank_members_or_not(meshsim_cluster):
    plan = Plan((step("mesh", layout=[[0], [1]], names=["a", "b"], out="m"),
                 step("from_local", mesh="m", local_shape=[2], placements=["S(0)", "R"], stride=[1], out="t"),
                 step("check", mesh="m")))
    result = meshsim_cluster.run(plan)
    assert result.passed, result.report()
    refused = predict(plan, 8).ranks[5].observations[1]  # a rank outside the mesh
    assert (refused.type, refused.match) == ("RuntimeError", "Please pass both shape and stride at the same time")
    with pytest.raises(PlanError, match="'shape' passes its own contiguous stride"):
        validate(Plan((step("init_device_mesh", shape=[8], names=["w"], out="w"),
                       step("from_local", mesh="w", local_shape=[2], placements=["S(0)"], shape=[16], stride=[1],
                            out="t"))), 8)


CONTEXT_PLAN = Plan((step("init_device_mesh", shape=[8], names=["w"], out="w"),
                     step("init_device_mesh", shape=[2, 4], names=["a", "b"], out="m"),
                     step("distribute", mesh="m", shape=[5, 2], placements=["S(0)", "R"], mesh_from="context",
                          out="t"),
                     step("from_local", mesh="w", local_shape=[2], placements=["S(0)"], mesh_from="context", out="u"),
                     step("full_tensor", tensor="u"),
                     step("distribute", mesh="m", shape=[3], placements=["R", "R"], mesh_from="none", out="v")))


def test_dtensor_calls_take_the_current_mesh_inside_with_mesh_and_are_refused_without_one(meshsim_cluster):
    result = meshsim_cluster.run(CONTEXT_PLAN)
    assert result.passed, result.differences
    seen = result.record.states[5].observations
    assert seen[2]["local_shape"] == [2, 2] and seen[2]["offset"] == [3, 0]  # rank 5: row 1 of m, rows 3-4 of 5
    assert seen[4]["shape"] == [16] and seen[5] == {"error": ["RuntimeError", "No device mesh is currently active!"]}


def test_a_seeded_bug_in_the_current_mesh_is_caught_where_two_meshes_are_entered():
    """torch's DTensor APIs fall back to the current mesh: a torch whose `with` stack hands out the outermost mesh
    passes a plan that enters one mesh, and fails one that enters a mesh inside another."""
    one = Plan((step("init_device_mesh", shape=[2, 2], names=["a", "b"], out="m"),
                step("distribute", mesh="m", shape=[4], placements=["S(0)", "R"], mesh_from="context", out="t")))
    two = Plan((step("init_device_mesh", shape=[4], names=["w"], out="w"), *one.steps[:1],
                step("distribute", mesh="m", shape=[4], placements=["S(0)", "R"], mesh_from="context", within="w",
                     out="t")))
    with Cluster(Topology(1, 4), deadline=10, setup="faults:current_mesh_is_outermost") as cluster:
        assert cluster.run(one).passed
        assert not cluster.run(two).passed


@pytest.mark.parametrize("bad, message", [
    ({"placements": ["Shard(0)"]}, "is not S(dim), R or P"),
    ({"placements": ["P(prod)"]}, "is not S(dim), R or P"),
    ({"shape": [5000]}, "at most 4096 elements"),
    ({"shape": [1, 1, 1, 1, 1]}, "1 to 4 sizes"),
    ({"mesh_from": "elsewhere"}, "must be one of argument, context, none"),
    ({"mesh_from": "none", "within": "m"}, "'within' makes a current mesh"),
])
def test_a_bad_dtensor_field_is_a_one_line_plan_error(bad, message):
    args = dict(mesh="m", shape=[4], placements=["S(0)"], out="t") | bad
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(Plan((step("init_device_mesh", shape=[2], out="m"), step("distribute", **args))), world=2)


@st.composite
def _composed(draw, composition):
    b = _Builder(4)
    b.add(step("init_device_mesh", shape=[2, 2], names=["a", "b"], out="m"))
    draw(composition(b, "m", b.run.handles["m"], True))
    return b.plan()


@pytest.mark.parametrize("composition", DTENSOR_COMPOSITIONS, ids=lambda c: c.__name__)
@settings(max_examples=40)
@given(data=st.data())
def test_each_dtensor_composition_makes_valid_plans_the_model_predicts(composition, data):
    plan = data.draw(_composed(composition))
    validate(plan, world=4)
    assert predict(plan, 4).model_error is None


@pytest.mark.parametrize("composition", DTENSOR_COMPOSITIONS, ids=lambda c: c.__name__)
def test_each_dtensor_composition_can_add_dtensor_steps(composition):
    # A composition may add nothing now and then (so that shrinking can drop it), but never always.
    from hypothesis import find

    dtensor_ops = {"distribute", "redistribute", "full_tensor", "to_local", "from_local", "sum"}
    find(_composed(composition), lambda plan: any(s.op in dtensor_ops for s in plan.steps),
         settings=settings(max_examples=200, database=None))


def test_the_default_sweep_draws_every_dtensor_operation():
    from hypothesis import Phase

    seen = set()

    @settings(max_examples=500, phases=[Phase.generate], derandomize=True, database=None)
    @given(plans(8))
    def collect(plan):
        seen.update(s.op for s in plan.steps)

    collect()
    assert {"distribute", "redistribute", "full_tensor", "to_local", "from_local", "sum"} <= seen


# ------------------------------------------------------------------------------------------ on a running cluster


def test_every_rank_holds_the_chunk_the_model_names_on_sliced_flattened_and_subset_meshes(meshsim_cluster):
    plan = Plan((
        step("init_device_mesh", shape=[2, 4], names=["dp", "tp"], out="m"),
        step("slice", src="m", names="tp", out="tp"),
        step("distribute", mesh="tp", shape=[5, 2], placements=["S(0)"], out="a"),
        step("flatten", src="m", out="f"),
        step("distribute", mesh="f", shape=[3, 3], placements=["S(1)"], out="b"),
        step("redistribute", tensor="b", placements=["S(0)"], out="c"),
        step("mesh", layout=[[6, 4], [2, 0]], names=["x", "y"], out="odd"),
        step("distribute", mesh="odd", shape=[3, 5], placements=["S(1)", "S(1)"], out="d"),
        step("full_tensor", tensor="d"),
        step("to_local", tensor="c"),
    ))
    result = meshsim_cluster.run(plan)
    assert result.passed, result.differences
    local = [state.observations[2] for state in result.record.states]
    assert [o["offset"] for o in local[:4]] == [[0, 0], [2, 0], [4, 0], [5, 0]]  # 5 rows over 4: 2, 2, 1, 0
    assert local[3]["local_shape"] == [0, 2] and local[3]["values"] == []
    assert "dtensor-chunk-by-group-rank" in result.findings


def test_a_seeded_wrong_chunk_order_in_torch_is_caught_as_a_disagreement(meshsim_cluster, monkeypatch):
    """The check can fail: a model that expects chunks by group rank on a monotonic mesh would still agree, so
    we seed the opposite bug, a model whose right side chunks in reverse, and the run must disagree."""
    def reversed_order(geo, rank, dim):
        return geo.line(rank, dim)[::-1]

    monkeypatch.setattr(D, "coordinate_order", reversed_order)
    monkeypatch.setattr(D, "group_rank_order", reversed_order)
    plan = Plan((step("init_device_mesh", shape=[8], out="m"),
                 step("distribute", mesh="m", shape=[8], placements=["S(0)"], out="t"),
                 step("to_local", tensor="t")))
    result = meshsim_cluster.run(plan)
    assert not result.passed
    assert any(d.op == "distribute" for d in result.differences)


def test_partial_to_shard_beside_a_size_one_shard_agrees_on_real_ranks(meshsim_cluster):
    assert_agrees(meshsim_cluster, PARTIAL_TO_SHARD_ON_A_PERMUTED_DIM)


def test_dtensor_plans_agree_with_the_model_on_the_shared_cluster(meshsim_cluster):
    from meshsim.sweep.properties import check_property

    @st.composite
    def dtensor_plans(draw):
        b = _Builder(meshsim_cluster.world)
        shape = draw(st.sampled_from([[8], [2, 4], [4, 2], [2, 2, 2]]))
        b.add(step("init_device_mesh", shape=shape, names=[f"d{i}" for i in range(len(shape))], out="m"))
        draw(draw(st.sampled_from(DTENSOR_COMPOSITIONS))(b, "m", b.run.handles["m"], True))
        return b.plan()

    check_property(meshsim_cluster, dtensor_plans(), max_examples=25)


def test_from_local_of_a_permuted_meshs_dtensor_carries_torchs_blocks_to_the_new_mesh():
    plan = Plan((step("mesh", layout=[1, 0], out="m"),
                 step("distribute", mesh="m", shape=[3], placements=["S(0)"], out="t"),
                 step("mesh", layout=[0, 1], out="n"),
                 step("from_local", mesh="n", tensor="t", placements=["R"], out="v"),
                 step("to_local", tensor="v")))
    seen = predict(plan, 2).ranks[0].observations[4]
    # rank 0 sits at coordinate 1 of [1, 0]: it should hold element 2 of rank 1's tensor (8192 + 2); torch scattered
    # it chunk 0 of its own (group rank 0's) tensor and cut it to [4096]
    assert isinstance(seen, Quirk) and seen.right["values"] == [8194] and seen.torch["values"] == [4096]


MERGED_GATHER = """format = 2
name = "merged-gather"
deadline = 20.0
[topology]
hosts = 2
devices_per_host = 2
[[step]]
op = "init_device_mesh"
shape = [2, 2]
names = ["dp", "tp"]
out = "m"
[[step]]
op = "flatten"
src = "m"
out = "f"
[[step]]
op = "distribute"
mesh = "m"
shape = [8]
placements = ["S(0)", "S(0)"]
out = "t"
[[step]]
op = "full_tensor"
tensor = "t"
"""


def test_a_redistribute_that_issues_other_collectives_than_torch_s_plan_fails_on_the_process_tier(tmp_path):
    """A seeded bug that leaves every value right: torch's merge of two all_gathers onto the flattened mesh is
    switched off, so full_tensor gathers twice. The process tier counts the collectives a step issues."""
    import subprocess
    import sys

    import torch.distributed.tensor._redistribute as redistribute

    from meshsim.core.releases import installed
    from meshsim.model.semantics import holds

    if not holds("redistribute-comms", installed()):
        pytest.skip("the model counts a redistribute's collectives from torch 2.11")
    source = open(redistribute.__file__, encoding="utf-8").read()
    call = "optimized_transform_infos = _optimize_transform_infos("
    assert call in source
    (tmp_path / "_redistribute.py").write_text(source.replace(call, "optimized_transform_infos = (lambda i, *_: i)("))
    (tmp_path / "merged.toml").write_text(MERGED_GATHER)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    site = os.path.join(root, "bench", "mutant_site")
    runs = {}
    for seeded in (False, True):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([site, root, os.environ.get("PYTHONPATH", "")]))
        if seeded:
            env.update(MESHSIM_MUTANT_MODULE="torch.distributed.tensor._redistribute",
                       MESHSIM_MUTANT_FILE=str(tmp_path / "_redistribute.py"))
        runs[seeded] = subprocess.run([sys.executable, "-m", "meshsim", "run", str(tmp_path / "merged.toml")],
                                      capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert runs[False].returncode == 0, runs[False].stdout[-2000:]
    assert runs[True].returncode != 0 and "comms.all_gather_into_tensor" in runs[True].stdout, runs[True].stdout[-3000:]
