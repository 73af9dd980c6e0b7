"""The model tier answers a world by classes of ranks that run a plan alike (meshsim.model.classes): what it
predicts must be what predicting every rank predicts, and a million ranks must cost a few ranks' runs."""

import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshsim import Cluster, Topology, step
from meshsim.core.ranks import group_text
from meshsim.judge.verdict import judge
from meshsim.model import to_json
from meshsim.model.classes import ClassView, lockstep, refine
from meshsim.model.predict import predict
from meshsim.spec.plan import Plan
from meshsim.sweep.strategies import divergent_plans, plans


def _everything(prediction, plan):
    """What a prediction says about the world: outcome, findings and the ranks they touch, culprits, stuck ranks."""
    verdict = judge(prediction.as_record(5.0, "model", plan), "plan", plan, prediction)
    stuck = {s.rank for s in prediction.stuck}
    if prediction.classes is not None:
        stuck = set(prediction.classes.expand(stuck))
    return (repr(to_json(prediction.outcome)), sorted(prediction.findings), sorted(prediction.culprits),
            verdict.outcome, sorted((f, sorted(h.ranks)) for f, h in verdict.findings.items()), verdict.culprits,
            sorted(stuck), prediction.undefined_from)


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_predicting_by_class_says_what_predicting_every_rank_says(data):
    world = data.draw(st.sampled_from([4, 6, 8, 12, 16, 32]))
    plan = data.draw(st.one_of(plans(world), divergent_plans(world)))
    by_rank, by_class = predict(plan, world, 5.0), predict(plan, world, 5.0, by_class=True)
    assert _everything(by_class, plan) == _everything(by_rank, plan), by_class.notes


def test_groups_whose_class_tags_sum_past_int64_are_classed_as_every_rank_says():
    """A group's composition is a sum of 62-bit tags per class, which wraps to a negative key (found by the property
    above: the lookup table of class ids was sized by a negative key)."""
    plan = Plan((
        step("init_device_mesh", shape=[1], out="m1"),
        step("init_device_mesh", shape=[6, 1, 1, 1, 1, 2], names=["dp", "tp", "cp", "pp", "a", "a0"], out="m2"),
        step("all_submeshes", src="m2", dim="dp", out="l3"),
        step("all_gather", mesh="m1"),
        step("distribute", mesh="l3.0", shape=[0], placements=["S(0)"], out="t4"),
        step("check", mesh="l3.1"),
    ))
    assert _everything(predict(plan, 12, 5.0, by_class=True), plan) == _everything(predict(plan, 12, 5.0), plan)


def test_a_mesh_that_names_a_rank_twice_is_predicted_rank_by_rank_as_every_rank_says():
    """Rank 4 is in two groups of one dim: classes (one group a dim for every rank) once played its second group
    creation alone and predicted a hang (found by the property above)."""
    plan = Plan((step("mesh", layout=[[4, 4, 2], [3, 1, 5]], out="m1"),))
    by_class = predict(plan, 6, 5.0, by_class=True)
    assert _everything(by_class, plan) == _everything(predict(plan, 6, 5.0), plan)
    assert any("rank by rank" in note for note in by_class.notes)


def test_a_million_ranks_of_a_layout_are_a_few_classes_and_judged_as_every_rank():
    plan = Plan((step("init_device_mesh", out="m", shape=[16, 8, 64, 16, 8], names=["pp", "dp", "fs", "cp", "tp"]),
                 step("query", mesh="m", what="get_all_groups"), step("check", mesh="m"),
                 step("flatten", src="m", name="dp_fs", out="f"), step("all_reduce", mesh="f")))
    with Cluster(Topology(131072, 8), tier="model") as executor:
        result = executor.run(plan)
    assert result.passed and result.outcome == "pass"
    assert len(result.prediction.classes) <= 4
    assert result.prediction.expected(1_048_575, 0)["coordinate"] == [15, 7, 63, 15, 7]  # a member's own place
    assert len(json.dumps(result.to_json())) < 1_000_000


def test_a_rank_that_skips_a_collective_in_a_million_is_the_one_culprit():
    plan = Plan((step("init_device_mesh", out="m", shape=[64, 16, 1024], names=["pp", "dp", "tp"]),
                 step("all_reduce", mesh="m", dim="dp", skip_on=[123457]), step("check", mesh="m")))
    with Cluster(Topology(131072, 8), tier="model") as executor:
        result = executor.run(plan)
    assert result.outcome == "hang" and result.culprits == [123457]
    assert "dim 'dp'" in result.diagnosis.summary
    report = result.report()
    assert len(report) < 200_000  # big groups are shown by their ends and size
    assert any("(1,024 ranks)" in group_text(w.group_ranks) for w in result.diagnosis.waits)
    assert len(json.dumps(result.to_json())) < 1_000_000


def test_a_class_view_indexes_every_rank_and_iterates_each_class_once():
    label = refine(np.zeros(6, dtype=np.int64), np.array([0, 1, 0, 1, 0, 1]))
    from meshsim.model.classes import RankClasses, representatives

    view = ClassView(RankClasses(label, representatives(label)), ["even", "odd"])
    assert len(view) == 6 and view[5] == "odd" and view[4] == "even" and list(view) == ["even", "odd"]


def test_classes_whose_calls_cross_are_not_called_lockstep():
    # ranks 0 and 3 reduce over dim a then b, ranks 1 and 2 over b then a: each waits for a partner in the other
    plan = Plan((step("init_device_mesh", out="m", shape=[2, 2], names=["a", "b"]),
                 step("all_reduce", mesh="m", dim="a", only_on=[0, 3]),
                 step("all_reduce", mesh="m", dim="b"),
                 step("all_reduce", mesh="m", dim="a", skip_on=[0, 3])))
    prediction = predict(plan, 4, 5.0, by_class=True)
    assert prediction.outcome == "hang" and predict(plan, 4, 5.0).outcome == "hang"
    same = Plan(plan.steps[:1] + (step("all_reduce", mesh="m", dim="a"), step("all_reduce", mesh="m", dim="b")))
    from meshsim.model.classes import Classifier
    from meshsim.model.predict import _run_rank
    from meshsim.spec.platform import CPU

    classifier = Classifier(same, 8, lambda r: _run_rank(same, r, 8, CPU))
    classes = classifier.settle(compositions=False)
    assert lockstep(classes, classifier.runs_of(classes))
