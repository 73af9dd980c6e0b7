"""Faults are steps too: a rank that sleeps, raises, exits or is killed. Drawn by the divergent strategies."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from ..core.wire import DIED, INJECTED, RAISED
from ..spec import fields as F
from ..spec.plan import step
from .registry import operation


class InjectedError(RuntimeError):
    """What a `raise` step throws: the rank leaves the plan."""


InjectedError.__name__ = InjectedError.__qualname__ = INJECTED


@st.composite
def _one_rank(draw: Any, b: Any) -> list[int]:
    return [draw(st.integers(0, b.world - 1))]


@operation("sleep", "fault", {"seconds": F.SECONDS}, ("seconds",))
class Sleep:
    """time.sleep(seconds): a straggler when it outlasts the deadline"""

    def model(run: Any, a: dict) -> Any:
        run.prediction.slept += float(a["seconds"])
        return None

    def torch(ex: Any, a: dict) -> Any:
        import time

        time.sleep(float(a["seconds"]))
        return None

    @st.composite
    def draw(draw: Any, b: Any, handle: Any, mesh: Any, allow_errors: bool) -> Any:
        return step("sleep", seconds=draw(st.sampled_from([0.0, 0.05])), only_on=draw(_one_rank(b)))


@operation("raise", "fault", {"message": F.TEXT})
class Raise:
    """raise an exception: this rank's plan ends (outcome error)"""

    def model(run: Any, a: dict) -> Any:
        from ..model.expect import Err

        run.end(RAISED)
        return Err(INJECTED, a.get("message", ""))

    def torch(ex: Any, a: dict) -> Any:
        raise InjectedError(a.get("message", ""))

    @st.composite
    def draw(draw: Any, b: Any, handle: Any, mesh: Any, allow_errors: bool) -> Any:
        return step("raise", message="injected", only_on=draw(_one_rank(b)))


@operation("exit", "fault", {"code": F.EXIT_CODE})
class Exit:
    """os._exit(code): the rank dies (outcome crash)"""

    def model(run: Any, a: dict) -> Any:
        run.end(DIED)
        return None

    def torch(ex: Any, a: dict) -> Any:
        ex.exit(int(a.get("code", 1)))

    @st.composite
    def draw(draw: Any, b: Any, handle: Any, mesh: Any, allow_errors: bool) -> Any:
        return step("exit", code=7, only_on=draw(_one_rank(b)))


@operation("kill", "fault")
class Kill:
    """SIGKILL to itself: the rank dies (outcome crash)"""

    def model(run: Any, a: dict) -> Any:
        run.end(DIED)
        return None

    def torch(ex: Any, a: dict) -> Any:
        ex.kill()

    @st.composite
    def draw(draw: Any, b: Any, handle: Any, mesh: Any, allow_errors: bool) -> Any:
        return step("kill", only_on=draw(_one_rank(b)))
