"""What torch chooses, told apart from what it must do.

A sharding strategy may propagate other placements from one release to the next (torch.sum of a DTensor on
2.14 keeps a Shard where 2.13 replicated): each is legal, and the values must be right whichever it is. An
operation names the key of its observation that is torch's choice (meshsim.ops: `chooses`). Where torch chose
otherwise than the model predicts, the plan is predicted again with torch's choice, so every value, shape and
offset is still checked, against the choice torch made; the report says that torch changed its choice, with
both. A choice the model cannot follow (no legal way to it) stays a difference.
"""

from __future__ import annotations

from typing import Any

from ..core.record import RunRecord
from ..ops import operation_of
from ..spec.plan import Plan
from .expect import Quirk
from .predict import Chosen, Prediction


def torch_chose(plan: Plan, prediction: Prediction, record: RunRecord) -> Chosen:
    """Steps where torch made a choice other than the model's: step -> torch's choice, one, the same on every rank
    that chose otherwise than the model predicts (ranks that disagree among themselves are a difference, not a
    choice). Ranks outside a DTensor's mesh may choose as the model predicts where its members do not: torch 2.15
    prices a sum's strategies by the rank's own local shape; the model follows a choice on the members only."""
    chosen: Chosen = {}
    for index, st in enumerate(plan.steps):
        key = operation_of(st).chooses
        if key is None:
            continue
        departed = {repr(o[key]): o[key] for o, e in _observed_expected(prediction, record, index)
                    if isinstance(o, dict) and key in o and isinstance(e, dict) and key in e and o[key] != e[key]}
        if len(departed) == 1:
            chosen[index] = next(iter(departed.values()))
    return chosen


def changes(plan: Plan, before: Prediction, record: RunRecord, chosen: Chosen, release: str) -> list[str]:
    """The report's lines: where torch changed its choice, with the model's and torch's."""
    lines = []
    for index, choice in sorted(chosen.items()):
        st = plan.steps[index]
        key = operation_of(st).chooses
        predicted = next((e[key] for e in _expected(before, record, index) if isinstance(e, dict) and key in e), None)
        lines.append(f"step {index} ({st.op}): torch {release} chose {key} {_text(choice)} where the model "
                     f"predicts {_text(predicted)}: torch changed its choice; checked against the one it made")
    return lines


def _observed_expected(prediction: Prediction, record: RunRecord, index: int) -> list[tuple[Any, Any]]:
    """(observation, the model's expectation) at `index`, on every rank that got that far."""
    return [(s.observations[index], _plain(prediction.expected(s.rank, index))) for s in record.states
            if s.observations is not None and index < len(s.observations)]


def _expected(prediction: Prediction, record: RunRecord, index: int) -> list[Any]:
    return [e for _, e in _observed_expected(prediction, record, index)]


def _plain(expected: Any) -> Any:
    return expected.torch if isinstance(expected, Quirk) else expected


def _text(value: Any) -> str:
    return "[" + ", ".join(map(str, value)) + "]" if isinstance(value, list) else str(value)
