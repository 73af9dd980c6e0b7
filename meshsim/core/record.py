"""The observation record: how every kind of run ended, rank by rank, and where each rank was.

Every executor (process, thread, fake, model, torchrun), every kind of work (a plan, a user function, a script)
and a replayed incident end in a RunRecord; meshsim.judge judges it with one rule. A RankState is built from the
rank's live progress messages (meshsim.core.wire), so a rank stuck inside C++ is located too: the call it waits in,
and for every group, the sequence of calls it issued there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .pace import KEPT, still_moving
from .ranks import group_text
from .wire import (
    DIED,
    FINISHED,
    RAISED,
    STUCK,
    Batch,
    CallBegun,
    CallDone,
    CallReturned,
    FunctionBegun,
    MeshBuilt,
    ScriptDone,
    StepBegun,
    dispatch,
)

# every rank ended; time ran out; a rank died or failed, and after a grace the others were stopped (as torchrun
# stops a job); the user interrupted it (Ctrl-C on `meshsim launch`); the unfinished ranks went still before the
# deadline, nothing left to wake them (meshsim.run.still)
STOPPED = ("finished", "deadline", "failure", "interrupted", "still")
Site = Any  # where a call was made: a plan's step index, or "file.py:LINE" in user code (None: unknown)


@dataclass
class RankState:
    rank: int
    step: int | None = None  # plan step being run (-1: teardown of the previous plan)
    op: str | None = None
    out: str | None = None
    call: CallBegun | None = None  # while blocked in it
    calls_on: dict[str, int] = field(default_factory=dict)  # group name -> collectives issued on it
    call_log: dict[tuple[str, int], tuple[Site, str]] = field(default_factory=dict)  # (group, seq) -> (site, kind)
    issued: list[tuple[str, int]] = field(default_factory=list)  # (group, seq) of every collective, in issue order
    sizes: dict[tuple[str, int], str] = field(default_factory=dict)  # (group, seq) -> the tensors it passed
    group_ranks: dict[str, tuple[int, ...]] = field(default_factory=dict)  # group name -> its members, as called
    roots: dict[tuple[str, int], int] = field(default_factory=dict)  # (group, seq) -> a rooted collective's root
    vias: dict[tuple[str, int], str] = field(default_factory=dict)  # (group, seq) -> the line that called its site
    groups_created: int = 0  # new_group calls seen (torch's group counter moves with them)
    created: dict[str, tuple[int, ...]] = field(default_factory=dict)  # group name -> ranks asked for
    created_as: dict[str, str] = field(default_factory=dict)  # group name -> its description (DeviceMesh's dim)
    created_at: dict[str, Site] = field(default_factory=dict)  # group name -> where it was created (a line, a step)
    # group name -> its place among the groups this rank is a member of, in creation order (1: its first after the
    # default group; torch's pg_id): SPMD code calls its n-th group where its peers call theirs
    group_index: dict[str, int] = field(default_factory=dict)
    # (step, shape, names, ranks) of each mesh it built the groups of
    meshes: list[tuple[Any, ...]] = field(default_factory=list)
    failed_in: CallBegun | None = None  # the call that raised on this rank (a peer that left makes it raise)
    # calls that returned a handle and have not completed (async_op, isend/irecv, DDP's gradient buckets), oldest
    # first: a rank stuck outside any call waits on the oldest of them (a Work's wait, DDP's reducer in C++)
    in_flight: dict[tuple[str, int], CallBegun] = field(default_factory=dict)
    failure: str = ""  # what that call raised
    done: bool = False  # sent its result
    observations: list[Any] | None = None
    end: str | None = None  # FINISHED | RAISED | DIED | STUCK (meshsim.core.wire)
    end_step: int | None = None
    exitcode: int | None = None
    output: str = ""  # what the rank printed (stdout and stderr) during this run
    value: Any = None  # a user function's result, or a script's ScriptDone
    group_count: int = 0  # torch's group counter on the rank when it finished
    completed: int = 0  # calls it completed (returned from, or saw complete)
    done_times: list[float] = field(default_factory=list)  # when its last pace.KEPT calls completed (wall clock)
    transports: tuple[Any, ...] = ()  # what the plan did with the rank's kept transports (PlanDone.transports)

    def __post_init__(self) -> None:
        self._handlers: dict[type, Callable[[Any], None]] = {
            StepBegun: self._step, CallBegun: self._call, CallReturned: self._returned, MeshBuilt: self._mesh,
            FunctionBegun: self._function, Batch: self._batch, CallDone: self._done}

    def on_event(self, event: Any) -> None:
        """Follow one progress message (meshsim.core.wire); any other kind is refused."""
        dispatch(event, self._handlers)

    def _step(self, event: StepBegun) -> None:
        self.step, self.op, self.out, self.call = event.step, event.op, event.out, None

    def _call(self, event: CallBegun) -> None:
        self.call = event
        if event.kind == "new_group":
            self.groups_created += 1
            self.created[event.group] = tuple(event.ranks)
            self.created_at[event.group] = event.site if event.site is not None else self.step
            if self.rank in event.ranks and event.group not in self.group_index:
                self.group_index[event.group] = len(self.group_index) + 1
            if event.context and len(event.context) > 1 and event.context[1]:
                self.created_as[event.group] = str(event.context[1])
        else:
            self.calls_on[event.group] = event.seq + 1
            self.call_log[(event.group, event.seq)] = (event.site if event.site is not None else self.step,
                                                       event.kind)
            self.issued.append((event.group, event.seq))
            self.group_ranks[event.group] = tuple(event.ranks)
            if event.root is not None:
                self.roots[(event.group, event.seq)] = event.root
            if event.via is not None:
                self.vias[(event.group, event.seq)] = event.via
            if event.sizes is not None:
                self.sizes[(event.group, event.seq)] = event.sizes

    def _batch(self, event: Batch) -> None:
        for inner in event.events:
            self.on_event(inner)

    def _returned(self, event: CallReturned) -> None:
        if event.error is not None:
            self.failed_in, self.failure = self.call, event.error
        elif event.pending and self.call is not None:
            self.in_flight[(self.call.group, self.call.seq)] = self.call
        else:
            if self.call is not None and self.in_flight:  # a group's calls complete in order: the earlier are done
                done = self.call
                self.in_flight = {key: c for key, c in self.in_flight.items()
                                  if c.group != done.group or c.seq > done.seq}
            if self.call is not None:  # (a group's creation too: a rendezvous of every rank)
                self._completed(event.time)
        self.call = None

    def _done(self, event: CallDone) -> None:
        call = self.in_flight.pop((event.group, event.seq), None)
        if event.error is not None and call is not None:
            self.failed_in, self.failure = call, event.error
        elif call is not None:
            self._completed(event.time)

    def _completed(self, when: float | None) -> None:
        self.completed += 1
        if when is not None:
            self.done_times.append(when)
            if len(self.done_times) > KEPT:
                del self.done_times[0]

    @property
    def waiting_on(self) -> CallBegun | None:
        """The call this rank is blocked in: the one it is inside, else the oldest it issued that has not
        completed (a rank waits on a Work, or in C++ as DDP's reducer does, outside any call of ours)."""
        if self.call is not None:
            return self.call
        return next(iter(self.in_flight.values()), None)

    def _mesh(self, event: MeshBuilt) -> None:
        self.meshes.append((self.step, event.shape, event.names, event.ranks))

    def _function(self, event: FunctionBegun) -> None:
        self.step, self.out, self.call = 0, None, None
        self.op = "script" if event.name == "script" else "function"

    def sequence(self, group: str) -> list[tuple[Site, str]]:
        """The calls this rank issued on `group`, in order: (site, kind)."""
        return [self.call_log.get((group, seq), (None, "?")) for seq in range(self.calls_on.get(group, 0))]

    @property
    def where(self) -> str:
        """Where the rank is, in words."""
        if self.end == DIED:
            return f"died (exit code {self.exitcode}) in step {self.step} ({self.op})"
        if self.end == RAISED:
            if self.failed_in is not None:
                return f"raised in {self.failed_in.kind} on group {group_text(self.failed_in.ranks)}: {self.failure}"
            if self.op == "function":
                return "raised in the user function"
            if self.op == "script":
                return _script_end(self.value)
            if self.end_step is None:
                return "failed (exited non-zero or raised)"
            return f"raised in step {self.end_step} and left the plan"
        if self.done:
            return FINISHED
        at = {"function": "in the user function", "script": "in the script"}.get(self.op or "", f"step {self.step}")
        if self.call is not None:
            site = f" at {self.call.site}" if self.call.site else ""
            return f"in {self.call.kind} on group {group_text(self.call.ranks)} ({at}{site})"
        if self.in_flight and self.end == STUCK:
            call = next(iter(self.in_flight.values()))
            site = f" at {call.site}" if call.site else ""
            return (f"waiting on {call.kind} on group {group_text(call.ranks)}, issued async ({at}{site}) and not "
                    "completed")
        if self.step is None:
            return "has not started"
        if self.step == -1:
            return "tearing down the previous plan"
        if self.op in ("function", "script"):
            return f"running the {'user function' if self.op == 'function' else 'script'} outside any collective"
        return f"running step {self.step} ({self.op}) outside any collective"


def name_helper_calls(states: list[RankState]) -> None:
    """A line of the user's that several of their lines call (a helper that makes every send of a pipeline) tells
    none of its calls apart: each is named by the line that called it instead ("pp.py:14 via pp.py:59"), wherever
    the judge compares where calls were made."""
    callers: dict[Any, set[str]] = {}
    for s in states:
        for key, (site, _) in s.call_log.items():
            if isinstance(site, str) and key in s.vias:
                callers.setdefault(site, set()).add(s.vias[key])
    helpers = {site for site, vias in callers.items() if len(vias) > 1}
    if not helpers:
        return
    for s in states:
        def named(key: tuple[str, int], site: Site, s: RankState = s) -> Site:
            return f"{site} via {s.vias[key]}" if site in helpers and key in s.vias else site

        s.call_log = {key: (named(key, site), kind) for key, (site, kind) in s.call_log.items()}
        s.in_flight = {key: c._replace(site=named(key, c.site)) for key, c in s.in_flight.items()}
        if s.call is not None and s.call.kind != "new_group":
            s.call = s.call._replace(site=named((s.call.group, s.call.seq), s.call.site))
        if s.failed_in is not None and s.failed_in.kind != "new_group":
            s.failed_in = s.failed_in._replace(site=named((s.failed_in.group, s.failed_in.seq), s.failed_in.site))


class RunStatus(NamedTuple):
    """How far a run is while it goes on (what a progress bar shows)."""

    ended: int  # ranks whose part has ended
    total: int
    elapsed: float  # seconds since the run began
    quiet: float  # seconds since the ranks last said anything
    waiting: str  # after a quiet while (meshsim.core.deadlines.QUIET_S): where the unfinished ranks are, in words


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
    stopped: str = "finished"  # what ended the run (STOPPED)
    # meshsim.model.classes.RankClasses where the model tier answered by class: states is then a ClassView (states[r] is
    # the state of r's class; iterating gives one state per class, its representative's)
    classes: Any = None
    ended_at: float | None = None  # when the run was stopped, by the wall clock (meshsim.core.pace)
    # calls the record cannot show, in words ("": it shows them all): gloo's Flight Recorder records no send or
    # recv, so a replayed rank in no recorded call may wait in one rather than stall
    unseen: str = ""
    # the process group backend the ranks ran on, where the executor follows every call they make (the process
    # tier; NCCL's DTensor issues other collectives than gloo's); None: the record does not say
    backend: str | None = None

    @property
    def still_moving(self) -> bool:
        """Every rank that had not finished when time ran out was still completing calls (meshsim.core.pace): the
        run is too slow for its deadline, not hung. Ranks seen to go still (their processes used no CPU for a
        while: meshsim.run.still) were not moving, however recent their last call."""
        return self.timed_out and self.stopped != "still" and still_moving(self.states, self.ended_at)

    @property
    def died(self) -> list[int]:
        return [s.rank for s in self.states if s.end == DIED]

    @property
    def raised(self) -> list[int]:
        return [s.rank for s in self.states if s.end == RAISED]

    @property
    def stuck(self) -> list[int]:
        return [s.rank for s in self.states if s.end == STUCK]


def _script_end(done: Any) -> str:
    """How a script ended on a rank that failed: the exception's own line and where in the script, or the exit
    code it chose."""
    if not isinstance(done, ScriptDone):
        return "exited non-zero (or raised) in the script"
    if done.error and done.traceback:
        return f"raised {done.error}" + (f" at {done.site}" if done.site else " in the script")
    return f"exited with code {done.exit_code}" + (f": {done.error}" if done.error else "") + \
        (f" at {done.site}" if done.site else "")
