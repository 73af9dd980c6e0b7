"""One generation of worker processes: started together, killed together when a plan goes wrong."""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from ..compat.patching import CompatError
from ..core.errors import ClusterError
from ..core.wire import JoinFailed, Ready, Stop, encoded
from .rank import STACK_SIGNAL, WorkerSpec, worker_main
from .reaper import ignore_interrupts_while, kill_group

# What a rank imports before any deadline starts: the forkserver imports it once for every worker it forks,
# and a rank torchrun started imports it before joining. DeviceMesh slicing imports the fx proxy-tensor
# machinery lazily (~0.6 s per rank on first use), and the first DTensor op imports DTensor and, through
# torch._disable_dynamo, all of dynamo (~300 modules, ~2 s of CPU per rank): 8 fresh ranks on 2 cores then
# spent over 4 s in their first DTensor step, which a 5 s deadline called a hang.
WARM_MODULES = ["torch", "torch.distributed", "torch.distributed.device_mesh", "torch.fx.experimental.proxy_tensor",
                "torch._subclasses.fake_tensor", "torch.distributed.tensor", "torch._dynamo", "dill",
                "meshsim.run.rank", "meshsim.run.interpreter", "meshsim.ops"]


def preload() -> list[str]:
    """What the forkserver imports before it forks a rank (then meshsim.run.warm freezes it). Under pytest,
    pytest too: a test's function travels by value with its module's globals, and unpickling it on 8 fresh ranks
    imported pytest inside the function's deadline, seconds on a loaded machine."""
    return WARM_MODULES + (["pytest"] if "pytest" in sys.modules else []) + ["meshsim.run.warm"]




def _read_since(path: str, offset: int, limit: int | None = None) -> tuple[str, int]:
    """A file's text past `offset` (at most its last `limit` bytes), and the new offset."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return "", offset
    if size <= offset:
        return "", offset
    start = offset if limit is None else max(offset, size - limit)
    with open(path, "rb") as fh:
        fh.seek(start)
        # Exactly up to `size`: what the rank writes meanwhile is read next time, from the offset returned
        # (reading to the end here read those bytes twice).
        data = fh.read(size - start)
    whole = _complete_utf8(data)  # a character cut at `size` is read whole next time
    return data[:whole].decode(errors="replace"), start + whole


def _complete_utf8(data: bytes) -> int:
    """The length of `data` without a UTF-8 sequence cut off at its end."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII): does its sequence fit in what is left?
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return len(data) - back if need > back else len(data)
    return len(data)


@dataclass
class Worker:
    rank: int
    process: Any
    conn: Connection
    stack_file: str
    output_file: str = ""
    error_file: str = ""  # the rank's stderr, where it is kept apart from its stdout ("": in output_file)
    pid: int = 0
    stack_offset: int = 0
    output_offset: int = 0
    error_offset: int = 0
    poller: Any = None

    def readable(self) -> bool:
        """Whether a message waits in the pipe (Connection.poll builds a selector per call: too slow here)."""
        if self.poller is None:
            self.poller = select.poll()
            self.poller.register(self.conn.fileno(), select.POLLIN)
        return bool(self.poller.poll(0))

    def new_output(self, limit: int | None = 4096) -> str:
        """What the rank printed since the last call (its last `limit` characters)."""
        text, self.output_offset = _read_since(self.output_file, self.output_offset, limit)
        return text

    def new_errors(self) -> str:
        """What the rank wrote to stderr since the last call, where stderr has a file of its own."""
        if not self.error_file:
            return ""
        text, self.error_offset = _read_since(self.error_file, self.error_offset)
        return text

    def new_stack(self) -> str:
        """What faulthandler wrote since the last call."""
        text, self.stack_offset = _read_since(self.stack_file, self.stack_offset)
        return text

    @property
    def alive(self) -> bool:
        if self.process.exitcode is not None:
            return False
        if self.pid and os.path.exists("/proc"):  # the exit status reaches us late through the forkserver
            try:
                with open(f"/proc/{self.pid}/stat") as fh:
                    return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
            except OSError:
                return False
        return True


@dataclass
class Generation:
    number: int
    workers: list[Worker] = field(default_factory=list)
    lifeline: Connection | None = None  # write end; when it closes, every worker of this generation exits
    reaper: Any = None  # kills the workers' process groups if the controller dies (meshsim.run.reaper)
    _launching: threading.Thread | None = None  # a launch going on behind the caller's back
    _launch_error: BaseException | None = None

    def start(self, ctx: Any, specs: list[WorkerSpec], timeout_s: float, reaper: Any = None,
              target: Any = worker_main) -> None:
        self.launch(ctx, specs, reaper, target)
        self.await_ready(timeout_s)

    def launch(self, ctx: Any, specs: list[WorkerSpec], reaper: Any = None, target: Any = worker_main,
               behind: bool = False) -> None:
        """Start the workers; they join the world on their own (await_ready waits for them). behind: from a
        thread of its own, while the caller goes on (launched() waits for it)."""
        if behind:
            self._launching = threading.Thread(target=self._launch_behind, args=(ctx, specs, reaper, target),
                                               name="meshsim-spare", daemon=True)
            self._launching.start()
            return
        self.reaper = reaper
        reader, self.lifeline = ctx.Pipe(duplex=False)
        try:
            for spec in specs:
                # Started and listed in one step that a Ctrl-C cannot split: a rank started but not yet listed
                # escaped the interrupt's kill, and met the run's files already removed (a traceback on stderr).
                ignore_interrupts_while(lambda spec=spec: self._start_worker(ctx, spec, reader, target))
        finally:
            reader.close()

    def _launch_behind(self, ctx: Any, specs: list[WorkerSpec], reaper: Any, target: Any) -> None:
        try:
            self.launch(ctx, specs, reaper, target)
        except BaseException as exc:  # told by launched(), in the caller's thread
            self._launch_error = exc

    def _settle_launch(self) -> None:
        """A launch behind the caller's back is over (so that every worker it starts is listed, to be stopped)."""
        if self._launching is not None:
            self._launching.join()
            self._launching = None

    def launched(self) -> None:
        """Wait for a launch made behind the caller's back; raise what it raised."""
        if self._launching is not None:
            self._launching.join()
            self._launching = None
        if self._launch_error is not None:
            error, self._launch_error = self._launch_error, None
            raise error

    def _start_worker(self, ctx: Any, spec: WorkerSpec, lifeline: Connection, target: Any) -> None:
        parent, child = ctx.Pipe()
        # Not daemonic, as torchrun's workers are not: a daemonic process may not start children, and a script's
        # DataLoader(num_workers > 0) or torch.multiprocessing.spawn must. Ranks end with the run all the same
        # (they are stopped and reaped by close(), the reaper, and PR_SET_PDEATHSIG).
        process = ctx.Process(target=target, args=(spec, child, lifeline), daemon=False,
                              name=f"meshsim-rank{spec.rank}")
        process.start()  # the forkserver starts here the first time
        child.close()
        self.workers.append(Worker(spec.rank, process, parent, spec.stack_file, spec.output_file,
                                   spec.error_file or ""))

    @property
    def ready(self) -> bool:
        return bool(self.workers) and all(w.pid for w in self.workers)

    def await_ready(self, timeout_s: float) -> None:
        waiting: dict[Any, Worker] = {w.conn: w for w in self.workers if not w.pid}
        end = time.monotonic() + timeout_s
        while waiting:
            left = end - time.monotonic()
            if left <= 0:
                late = sorted(w.rank for w in waiting.values())
                raise ClusterError(f"ranks {late} did not join within {timeout_s:.0f} s")
            for conn in wait(list(waiting), timeout=left):
                worker = waiting.pop(conn)
                try:
                    message = worker.conn.recv()
                except (EOFError, OSError):
                    worker.process.join(1.0)
                    raise ClusterError(
                        f"rank {worker.rank} died while starting (exit code {worker.process.exitcode}); "
                        "a script that starts a cluster must do so under `if __name__ == \"__main__\":`"
                    ) from None
                if isinstance(message, JoinFailed) and message.incompatible:
                    raise CompatError(message.reason)
                if not isinstance(message, Ready):
                    reason = message.reason if isinstance(message, JoinFailed) else repr(message)
                    raise ClusterError(f"rank {worker.rank} could not join the world: {reason}")
                worker.pid = message.pid
                if self.reaper is not None:
                    self.reaper.watch(worker.pid)  # the worker leads its own process group

    def send(self, message: tuple) -> None:
        payload = encoded(message)  # pickled once for every worker (a plan can be large)
        for worker in self.workers:
            try:
                worker.conn.send_bytes(payload)
            except (BrokenPipeError, OSError):
                pass  # a worker that died: the follow loop buries it

    def stacks(self, ranks: list[int], settle_s: float = 0.2) -> dict[int, str]:
        """Python stacks of the given live ranks, dumped by faulthandler (works inside C++ waits too)."""
        targets = [w for w in self.workers if w.rank in ranks and w.alive]
        for worker in targets:
            try:
                os.kill(worker.pid, STACK_SIGNAL)
            except ProcessLookupError:
                pass
        time.sleep(settle_s)
        return {worker.rank: worker.new_stack() for worker in targets}

    def kill(self) -> None:
        self._settle_launch()
        for worker in self.workers:
            if worker.alive and worker.pid:
                try:
                    os.kill(worker.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            elif worker.alive:
                worker.process.kill()
        self._reap(5.0)

    def stop(self, timeout_s: float = 3.0) -> None:
        self._settle_launch()
        self.send(Stop())
        if self.lifeline is not None:
            self.lifeline.close()
            self.lifeline = None
        self._reap(timeout_s)
        if any(w.alive for w in self.workers):
            self.kill()

    def _reap(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        for worker in self.workers:
            worker.process.join(max(0.0, end - time.monotonic()))
            if worker.process.exitcode is None:
                worker.process.kill()
                worker.process.join(1.0)
        for worker in self.workers:
            if worker.pid:
                kill_group(worker.pid)  # whatever the rank started, subprocesses and forks, goes with it
                if self.reaper is not None:
                    self.reaper.forget(worker.pid)
            worker.conn.close()
            for path in (worker.stack_file, worker.output_file, worker.error_file):
                if not path:
                    continue
                try:
                    os.unlink(path)
                except OSError:
                    pass
        if self.lifeline is not None:
            self.lifeline.close()
            self.lifeline = None
