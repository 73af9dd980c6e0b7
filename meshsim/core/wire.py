"""The words ranks and the controller exchange, named once: typed messages and the observation vocabulary.

Both sides import this module and nothing of each other: the ranks (meshsim.run) never import the model, and
the model never imports torch. A message is a NamedTuple; `dispatch` sends it to the handler of its type and
refuses any type it does not know, so a message nobody reads cannot pass silently.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any, NamedTuple

# ------------------------------------------------------------------------------------------ observations

SKIPPED = {"skipped": True}  # the step does not run on this rank (or the rank left the plan before it)
INJECTED = "MeshsimInjectedError"  # type name of the exception a `raise` step throws

# How a rank's part of a run ended.
FINISHED, RAISED, DIED, STUCK = "finished", "raised", "died", "stuck"


# A collective on the fake tier: torch's fake process group moves no data, so there is no result to check.
UNMOVED = {"unmoved": "the fake process group moves no data"}


def digest_ints(flat: bytes, shape: list[int]) -> dict[str, Any]:
    """A large mesh view, as a digest: `flat` is its ranks as little-endian int64, row-major."""
    import hashlib

    return {"digest": hashlib.blake2b(flat, digest_size=12).hexdigest(), "shape": list(shape)}


RUN_CHECK_CALL = "dtensor from_local run_check"  # the model's name for run_check's gather (a hang names it)
DTENSOR_CALL = "dtensor"  # the model's calls of a DTensor step: "dtensor <step>", detail (torch's collective,)
# What the model predicts of a DTensor's values on a mesh too large to simulate them (shapes and offsets it does)
NOT_SIMULATED = "not simulated (a mesh of more than 1,024 ranks: local shapes, offsets and collectives are)"
SHOWN_VALUES = 64  # a tensor of more values than this is observed as a digest


def tensor_values(flat: Any) -> Any:
    """A tensor's values as observed: exact (rounded to 6 decimals; integral values as ints), or a digest when
    there are many."""
    shown = []
    for v in flat:
        r = round(float(v), 6) + 0.0  # + 0.0: no -0.0
        shown.append(int(r) if r.is_integer() else r)
    if len(shown) <= SHOWN_VALUES:
        return shown
    import hashlib

    return {"values_digest": hashlib.blake2b(repr(shown).encode(), digest_size=10).hexdigest(), "numel": len(shown)}


def local_observation(local_shape: Any, values: Any, offset: Any, placements: list[str], shape: Any) -> dict[str, Any]:
    """What a rank observes of a DTensor: its spec, its local tensor, and where that sits in the whole."""
    return {"shape": list(shape), "placements": placements, "local_shape": list(local_shape),
            "offset": list(offset), "values": values}


def is_digest(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"digest", "shape"}


def error_value(exc: BaseException) -> dict[str, Any]:
    """An exception as an observation: {"error": [type name, message]}."""
    message = str(exc.args[0]) if len(exc.args) == 1 else " ".join(str(a) for a in exc.args)
    return {"error": [type(exc).__name__, message]}


def is_error(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"error"}


# ------------------------------------------------------------------------------------------ controller -> rank

# Point-to-point calls, by the side of the pair they are on. Each is announced on its channel, the group's calls
# from one rank to another ("<group>:<src>-><dst>", meshsim.compat.follow): a recv pairs with its peer's send, not
# with whatever the group's other members did (a pipeline's stages each talk to their neighbours only).
SENDS = ("send", "isend", "send_object_list")
RECVS = ("recv", "irecv", "recv_object_list")
# collectives with one root rank: its argument's name (SPMD code names the same root on every member)
ROOTED = {"broadcast": "src", "broadcast_object_list": "src", "scatter": "src", "scatter_object_list": "src",
          "reduce": "dst", "gather": "dst", "gather_object": "dst"}
POINT_TO_POINT = (*SENDS, *RECVS)


def channel(group: str, src: int, dst: int, tag: int = 0) -> str:
    """A point-to-point channel's name: "<group>:<src>-><dst>", and " tag <n>" where the tag is not 0 (gloo pairs a
    send with the recv of its own tag: two tags between the same ranks are two channels)."""
    return f"{group}:{src}->{dst}" + (f" tag {tag}" if tag else "")


def channel_group(name: str) -> str:
    """The group a channel's calls are made on (the name itself for a group's)."""
    return name.rpartition(":")[0] or name


def channel_ends(name: str) -> tuple[int, int, int] | None:
    """(src, dst, tag) of a channel's name; None for a group's."""
    _, colon, ends = name.rpartition(":")
    route, _, tag = ends.partition(" tag ")
    src, arrow, dst = route.partition("->")
    if not (colon and arrow and src.isdigit() and dst.isdigit() and (not tag or tag.lstrip("-").isdigit())):
        return None
    return int(src), int(dst), int(tag or 0)


class RunPlan(NamedTuple):
    plan: Any  # meshsim.spec.Plan
    deadline: float


class RunFunction(NamedTuple):
    payload: bytes  # (fn, args, kwargs) pickled with dill
    deadline: float


class ScriptHost(NamedTuple):
    """What one rank of `meshsim launch` sees of its simulated host, beyond Topology.env: torchrun's variables for
    this attempt (None: unset), the host's name, its own working directory (--host-dirs), its thread count."""

    env: dict[str, str | None]
    hostname: str
    hostnames: tuple[str, ...]  # every simulated host's name: each resolves to loopback, as a cluster's DNS would
    cwd: str  # the launch's directory (one disk shared by every host), or the host's own (--host-dirs)
    tmpdir: str | None = None  # the host's own temporary directory (--host-dirs); None: the machine's
    threads: int | None = None  # torch.set_num_threads (OMP_NUM_THREADS, as torchrun sets it); None: torch's own


class RunScript(NamedTuple):
    """Run a user's script (or module, with -m) as __main__ with these arguments, as torchrun would."""

    target: str
    is_module: bool
    argv: list[str]
    deadline: float
    hosts: tuple[ScriptHost, ...] = ()  # one a rank, by rank (empty: Topology.env alone)
    launch_dir: str = ""  # where `python -m` would look for the module (the launch's working directory)


class RunRanks(NamedTuple):
    """Run a plan as each of these ranks in turn, alone (the fake tier)."""

    plan: Any
    deadline: float
    ranks: list[int]


class Teardown(NamedTuple):
    next_group_count: int  # torch's group counter continues from here on every rank
    forget: tuple[Any, ...] | None = None  # the kept transports to drop (None: all of them; meshsim.run.transports)


class Stop(NamedTuple):
    pass


class Report(NamedTuple):
    """Send now what every rank did so far (a host that keeps its ranks' progress until they finish); `finished`:
    also what the ranks that have sent their result did (a thread host keeps a finished plan's progress until the
    controller asks: meshsim.run.threads)."""

    finished: bool = False


class Reported(NamedTuple):
    """Everything a Report asked for has been sent."""


# ------------------------------------------------------------------------------------------ rank -> controller

class Ready(NamedTuple):
    pid: int


class JoinFailed(NamedTuple):
    reason: str
    incompatible: bool = False  # a patch of meshsim's does not fit the installed torch (meshsim.compat)


class StepBegun(NamedTuple):
    step: int  # -1: tearing down the previous plan
    op: str
    out: str | None
    time: float


class CallBegun(NamedTuple):
    """About to block in `kind` on the group `ranks` (torch's group name `group`), its `seq`-th call there."""

    kind: str  # a collective's name, or "new_group"
    ranks: tuple[int, ...]
    group: str
    seq: int
    context: tuple[Any, ...] | None  # (mesh handle or label, dim[, group coordinate]) when known
    site: str | int | None = None  # where in the user's code ("train.py:42"), or a plan's step; None: unknown
    sizes: str | None = None  # the tensors it passed, "float32[4]" (user code; a plan's are the model's to know)
    root: int | None = None  # a rooted collective's root, a global rank (broadcast's src, reduce's dst; user code)
    via: str | None = None  # the user's line that called the function at `site` (which may be a helper of theirs)


class CallReturned(NamedTuple):
    error: str | None = None  # the call raised this ("RuntimeError: Connection closed by peer")
    pending: bool = False  # it returned a handle (async_op, isend): the call stays in flight until CallDone
    time: float | None = None  # when it returned, by the rank's wall clock (meshsim.core.pace: still moving?)


class CallDone(NamedTuple):
    """A call that returned a handle has completed (its future, or a wait on its Work), or failed (`error`)."""

    group: str
    seq: int
    error: str | None = None
    time: float | None = None  # when it completed, by the rank's wall clock


class Batch(NamedTuple):
    """Several messages of a rank in one: a plan's "call returned" rides with the message that follows it, and a
    thread rank's progress rides with a function's result, or with what a Report asks for (meshsim.run.threads)."""

    events: tuple[Any, ...]


class FunctionBegun(NamedTuple):
    name: str


class MeshBuilt(NamedTuple):
    """DeviceMesh is about to create the groups of a mesh of this shape over these ranks (row-major)."""

    shape: tuple[int, ...]
    names: tuple[str, ...] | None
    ranks: tuple[int, ...]


class PlanDone(NamedTuple):
    observations: list[Any]
    end: str  # FINISHED | RAISED
    end_step: int | None
    group_count: int
    # ((the group's ranks, its timeout), the sequence number of its backend) of every transport the plan made or
    # reused, where the ranks keep them from one plan to the next (meshsim.run.transports)
    transports: tuple[Any, ...] = ()


class FunctionDone(NamedTuple):
    ok: bool
    value: bytes  # the return value, or (exception, traceback text), pickled with dill
    group_count: int


class ScriptDone(NamedTuple):
    exit_code: int
    traceback: str  # the uncaught exception's traceback ("" when the script ended normally or by sys.exit)
    group_count: int
    error: str = ""  # the exception's own line, "RuntimeError: CUDA error: invalid device ordinal" ("": none)
    site: str = ""  # the innermost line of the script the exception passed, "train.py:42" ("": not in the script)


PROGRESS = (StepBegun, CallBegun, CallReturned, CallDone, FunctionBegun, MeshBuilt, Batch)
MESSAGES = (RunPlan, RunFunction, RunScript, Teardown, Stop, Report, Reported, Ready, JoinFailed, *PROGRESS, PlanDone,
            FunctionDone, ScriptDone)


class WireError(RuntimeError):
    """A message of a kind this side does not know."""


class FromRank(NamedTuple):
    """A message of one rank, where one process hosts many (the thread and fake tiers)."""

    rank: int
    message: Any


class RankDied(NamedTuple):
    """A rank that is a thread or a loop iteration ended as a process would have died (an exit/kill fault)."""

    exitcode: int


def encoded(message: Any) -> bytes:
    """A message as a pipe carries it (multiprocessing's Connection.recv reads it back): plain pickle, without
    multiprocessing's ForkingPickler, whose set-up per message cost a rank more than the message. Messages are
    plain data, which needs none of its reducers."""
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def sender(conn: Any) -> Callable[[Any], None]:
    """conn.send, through encoded()."""
    def send(message: Any) -> None:
        conn.send_bytes(encoded(message))
    return send


def dispatch(message: Any, handlers: dict[type, Callable[[Any], Any]]) -> Any:
    handler = handlers.get(type(message))
    if handler is None:
        raise WireError(f"unknown message {type(message).__name__}: {message!r:.200}")
    return handler(message)
