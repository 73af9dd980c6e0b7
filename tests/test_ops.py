"""One definition per operation, one wire format, one check: the seams the other layers stand on."""

import subprocess
import sys

import pytest
from hypothesis import Phase, given, settings

from meshsim import Plan, step
from meshsim.check import check
from meshsim.core.record import RankState
from meshsim.core.wire import CallBegun, Stop, WireError, dispatch
from meshsim.ops import OPERATIONS, PARTS, operation
from meshsim.spec import fields as F
from meshsim.sweep.strategies import WEIGHTS, divergent_plans, plans


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_every_operation_has_fields_a_doc_a_model_step_a_torch_step_and_a_strategy(name):
    op = OPERATIONS[name]
    assert op.doc and all(callable(getattr(op, part)) for part in PARTS)
    assert all(isinstance(kind, F.Kind) for kind in op.fields.values())
    assert set(op.required) <= set(op.fields)


def test_an_operation_missing_a_part_is_refused_when_it_is_defined():
    with pytest.raises(TypeError, match="lacks torch"):
        @operation("half_done", "query")
        class HalfDone:
            """an op with no torch step"""

            def model(run, a):
                return None

            def draw(b, handle, mesh, allow_errors):
                return None
    assert "half_done" not in OPERATIONS


def _drawn_ops(strategy, examples=300):
    seen = set()

    @settings(max_examples=examples, database=None, phases=[Phase.generate], deadline=None, derandomize=True)
    @given(strategy)
    def collect(plan):
        seen.update(s.op for s in plan.steps)

    collect()
    return seen


def test_the_plan_strategy_draws_every_operation_but_the_faults():
    assert _drawn_ops(plans(8), 600) == {name for name, op in OPERATIONS.items() if op.role != "fault"}


def test_an_operation_the_plan_strategy_would_never_draw_is_refused_when_it_is_defined():
    with pytest.raises(TypeError, match="needs a weight"):
        @operation("never_drawn", "query")
        class NeverDrawn:
            """an op with no weight"""

            def model(run, a):
                return None

            def torch(ex, a):
                return None

            def draw(b, handle, mesh, allow_errors):
                return None
    assert "never_drawn" not in OPERATIONS and "never_drawn" not in WEIGHTS


def test_the_divergent_strategy_draws_every_fault():
    assert _drawn_ops(divergent_plans(8), 200) >= {"raise", "exit", "kill", "sleep"}


def test_the_wire_refuses_a_message_kind_nobody_reads():
    with pytest.raises(WireError, match="unknown message tuple"):
        dispatch(("call", "all_reduce"), {Stop: lambda m: None})
    state = RankState(0)
    state.on_event(CallBegun("all_reduce", (0, 1), "3", 0, None))
    assert state.call.group == "3"
    with pytest.raises(WireError):
        state.on_event(("ret",))


def test_the_ranks_and_the_model_do_not_import_each_other():
    # The ranks may know the model's vocabulary of expectations (meshsim.model.expect: Err, Quirk, plain data),
    # never the code that computes predictions: torch's side can then not borrow the answer it is checked against.
    code = ("import sys, meshsim.run.interpreter, meshsim.run.rank; "
            "print(sorted(m for m in sys.modules if m.startswith('meshsim.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = eval(out.stdout)
    assert [m for m in loaded if m.startswith("meshsim.model.")] == ["meshsim.model.expect"]
    assert not [m for m in loaded if m.startswith(("meshsim.judge", "meshsim.model.predict", "meshsim.check"))]
    code = "import sys, meshsim.model, meshsim.check; print([m for m in sys.modules if m.startswith('meshsim.run.')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


class _RecordingExecutor:
    """An executor that runs nothing: enough to see check() reach the verdict without ranks."""

    from meshsim import Topology
    from meshsim.spec.platform import CPU as platform
    from meshsim.spec.tiers import TIERS

    tier, capabilities, world, topology = "model", TIERS["model"], 2, Topology(1, 2)

    def execute(self, work, meanwhile=None, if_hangs=None):
        from meshsim.core.record import RankState, RunRecord

        if meanwhile:
            meanwhile()
        states = [RankState(r, observations=[None] * len(work.plan.steps), end="finished", done=True)
                  for r in range(self.world)]
        return RunRecord(self.world, work.deadline, states, 0.0, False)


def test_an_exception_inside_the_model_becomes_a_verdict_not_a_traceback(monkeypatch):
    def broken(run, args):
        raise ZeroDivisionError("model bug")

    import dataclasses

    monkeypatch.setitem(OPERATIONS, "get_rank", dataclasses.replace(OPERATIONS["get_rank"], model=broken))
    plan = Plan((step("init_device_mesh", shape=[2], names=["x"], out="m"), step("get_rank", mesh="m")))
    result = check(_RecordingExecutor(), plan, deadline=1)
    assert not result.passed
    (difference,) = result.differences
    assert "the model cannot predict this plan: ZeroDivisionError: model bug" in str(difference.rows[0][1])
    assert (difference.step, difference.op) == (1, "get_rank")  # the step the model failed at, not step 0


def test_get_rank_on_every_rank_is_its_global_rank(meshsim_cluster):
    plan = Plan((step("mesh", layout=[[7, 6, 5, 4], [3, 2, 1, 0]], names=["a", "b"], out="m"),
                 step("slice", src="m", names="b", out="s"), step("get_rank", mesh="s")))
    result = meshsim_cluster.run(plan)
    assert result.passed, result.differences
    assert [state.observations[2] for state in result.record.states] == list(range(8))
