"""What the controller saw of each rank while something ran: progress, results, deaths, stacks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..wire import (DIED, FINISHED, RAISED, STUCK, Batch, CallBegun, CallReturned, FunctionBegun, MeshBuilt,
                    StepBegun, dispatch)


@dataclass
class RankState:
    rank: int
    step: int | None = None  # plan step being run (-1: teardown of the previous plan)
    op: str | None = None
    out: str | None = None
    call: CallBegun | None = None  # while blocked in it
    calls_on: dict[str, int] = field(default_factory=dict)  # group name -> calls made on it
    call_log: dict[tuple[str, int], tuple[Any, str]] = field(default_factory=dict)  # (group, seq) -> (step, kind)
    groups_created: int = 0  # new_group calls seen (torch's group counter moves with them)
    created: dict[str, tuple[int, ...]] = field(default_factory=dict)  # group name -> ranks asked for
    created_as: dict[str, str] = field(default_factory=dict)  # group name -> its description (DeviceMesh's dim)
    meshes: list[tuple] = field(default_factory=list)  # (shape, names, ranks) of each mesh whose groups it made
    done: bool = False  # sent its result
    observations: list[Any] | None = None
    end: str | None = None  # FINISHED | RAISED | DIED | STUCK (meshsim.wire)
    end_step: int | None = None
    exitcode: int | None = None
    output: str = ""  # what the rank printed (stdout and stderr) during this run
    value: Any = None  # a user function's result
    group_count: int = 0  # torch's group counter on the rank when it finished

    def __post_init__(self) -> None:
        self._handlers = {StepBegun: self._step, CallBegun: self._call, CallReturned: self._returned,
                          MeshBuilt: self._mesh, FunctionBegun: self._function, Batch: self._batch}

    def on_event(self, event: Any) -> None:
        """Follow one progress message (meshsim.wire); any other kind is refused."""
        dispatch(event, self._handlers)

    def _step(self, event: StepBegun) -> None:
        self.step, self.op, self.out, self.call = event.index, event.op, event.out, None

    def _call(self, event: CallBegun) -> None:
        self.call = event
        if event.kind == "new_group":
            self.groups_created += 1
            self.created[event.group] = tuple(event.ranks)
            if event.context and len(event.context) > 1 and event.context[1]:
                self.created_as[event.group] = str(event.context[1])
        else:
            self.calls_on[event.group] = event.seq + 1
            self.call_log[(event.group, event.seq)] = (self.step, event.kind)

    def _batch(self, event: Batch) -> None:
        for inner in event.events:
            self.on_event(inner)

    def _returned(self, event: CallReturned) -> None:
        self.call = None

    def _mesh(self, event: MeshBuilt) -> None:
        self.meshes.append((self.step, event.shape, event.names, event.ranks))

    def _function(self, event: FunctionBegun) -> None:
        self.step, self.out, self.call = 0, None, None
        self.op = "script" if event.name == "script" else "function"

    @property
    def where(self) -> str:
        """Where the rank is, in words."""
        if self.end == DIED:
            return f"died (exit code {self.exitcode}) in step {self.step} ({self.op})"
        if self.end == RAISED:
            if self.end_step is None:
                return "failed (exited non-zero or raised)"
            return f"raised in step {self.end_step} and left the plan"
        if self.done:
            return FINISHED
        at = {"function": "in the user function", "script": "in the script"}.get(self.op, f"step {self.step}")
        if self.call is not None:
            return f"in {self.call.kind} on group {list(self.call.ranks)} ({at})"
        if self.step is None:
            return "has not started"
        if self.step == -1:
            return "tearing down the previous plan"
        if self.op in ("function", "script"):
            return f"running the {'user function' if self.op == 'function' else 'script'} outside any collective"
        return f"running step {self.step} ({self.op}) outside any collective"


@dataclass
class RunRecord:
    world: int
    deadline: float
    states: list[RankState]
    elapsed: float
    timed_out: bool  # some ranks had not finished when time ran out
    stacks: dict[int, str] = field(default_factory=dict)
    tier: str = "process"
    checked: list[int] | None = None  # the ranks that ran (None: all); the others are not judged
    moves_data: bool = True  # False on the fake tier: collectives return nothing to check
    notes: list[str] = field(default_factory=list)  # what this tier could not check, in words

    @property
    def died(self) -> list[int]:
        return [s.rank for s in self.states if s.end == DIED]

    @property
    def raised(self) -> list[int]:
        return [s.rank for s in self.states if s.end == RAISED]

    @property
    def stuck(self) -> list[int]:
        return [s.rank for s in self.states if s.end == STUCK]
