"""What the controller saw of each rank while something ran: progress, results, deaths, stacks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RankState:
    rank: int
    step: int | None = None  # plan step being run (-1: teardown of the previous plan)
    op: str | None = None
    out: str | None = None
    call: tuple | None = None  # ("call", kind, ranks, group, seq, ctx) while blocked in it
    calls_on: dict[str, int] = field(default_factory=dict)  # group name -> calls made on it
    call_log: dict[tuple[str, int], tuple[Any, str]] = field(default_factory=dict)  # (group, seq) -> (step, kind)
    groups_created: int = 0  # new_group calls seen (torch's group counter moves with them)
    created: dict[str, tuple[int, ...]] = field(default_factory=dict)  # group name -> ranks asked for
    meshes: list[tuple] = field(default_factory=list)  # (shape, names, ranks) of each mesh whose groups it made
    done: bool = False  # sent its result
    observations: list[Any] | None = None
    end: str | None = None  # finished | raised | died | stuck
    end_step: int | None = None
    exitcode: int | None = None
    output: str = ""  # what the rank printed (stdout and stderr) during this run
    value: Any = None  # a user function's result
    group_count: int = 0  # torch's group counter on the rank when it finished

    def on_event(self, event: tuple) -> None:
        kind = event[0]
        if kind == "step":
            self.step, self.op, self.out = event[1], event[2], event[3]
            self.call = None
        elif kind == "call":
            self.call = event
            if event[1] == "new_group":
                self.groups_created += 1
                self.created[event[3]] = tuple(event[2])
            else:
                self.calls_on[event[3]] = event[4] + 1
                self.call_log[(event[3], event[4])] = (self.step, event[1])
        elif kind == "ret":
            self.call = None
        elif kind == "mesh":
            self.meshes.append((self.step,) + tuple(event[1:]))
        elif kind == "fn":
            self.step, self.op, self.out = 0, "function", None
            self.call = None

    @property
    def where(self) -> str:
        """Where the rank is, in words."""
        if self.end == "died":
            return f"died (exit code {self.exitcode}) in step {self.step} ({self.op})"
        if self.end == "raised":
            return f"raised in step {self.end_step} and left the plan"
        if self.done:
            return "finished"
        at = "in the user function" if self.op == "function" else f"step {self.step}"
        if self.call is not None:
            _, kind, ranks, _, _, ctx = self.call
            return f"in {kind} on group {list(ranks)} ({at})"
        if self.step is None:
            return "has not started"
        if self.step == -1:
            return "tearing down the previous plan"
        if self.op == "function":
            return "running the user function outside any collective"
        return f"running step {self.step} ({self.op}) outside any collective"


@dataclass
class RunRecord:
    world: int
    deadline: float
    states: list[RankState]
    elapsed: float
    timed_out: bool  # some ranks had not finished when time ran out
    stacks: dict[int, str] = field(default_factory=dict)

    @property
    def died(self) -> list[int]:
        return [s.rank for s in self.states if s.end == "died"]

    @property
    def raised(self) -> list[int]:
        return [s.rank for s in self.states if s.end == "raised"]

    @property
    def stuck(self) -> list[int]:
        return [s.rank for s in self.states if s.end == "stuck"]
