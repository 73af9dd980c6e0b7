"""Worker processes on this machine, one generation at a time: what the process, thread and fake tiers share.

The pool hosts the TCPStore on loopback (port chosen by the OS), forks its workers from a forkserver that has
torch imported, registers them with the reaper (so none outlives the controller), and starts a fresh generation
after a hang or a death, under a fresh store prefix so that stale keys never meet new ranks. What a worker is (a
rank, a host of thread ranks, a player of fake ranks) is the tier's business: it hands the pool the specs and the
target function.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import tempfile
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Self

from ..core.errors import ClusterError, SetupError
from .generation import Generation, preload
from .rank import WorkerSpec
from .reaper import Reaper

FORGET_EVERY = 16  # runs between two deletions of their groups' store keys (tens of kilobytes held at most)

_open_pools: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


class WorkerPool:
    """Generations of workers started by `specs(number, tmp_dir, port)` running `target`."""

    def __init__(self, specs: Callable[[int, str, int], list[WorkerSpec]], target: Callable[..., None],
                 start_timeout: float, after_start: Callable[[Generation], None] | None = None):
        self.specs, self.target, self.start_timeout = specs, target, start_timeout
        self.after_start = after_start
        self.generation: Generation | None = None
        self.spare: Generation | None = None  # started ahead, to replace the running generation
        self.spares_used = 0
        self.generations_started = 0
        self.store: Any = None
        self.port = 0
        self._kept_keys: set[str] | None = None  # store keys of the running generation itself (not of its work)
        self._runs_unforgotten = 0  # runs since their store keys were last deleted
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._ctx: Any = None
        self._reaper: Reaper | None = None

    @property
    def started(self) -> bool:
        return self.store is not None

    def start(self) -> None:
        if self.store is not None:
            return
        import torch.distributed as dist
        import torch.multiprocessing as mp

        self._tmp = tempfile.TemporaryDirectory(prefix="meshsim-")
        # The store listens on loopback only: TCPStore binds every interface unless handed a socket.
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1024)
        self.port = listener.getsockname()[1]
        self.store = dist.TCPStore("127.0.0.1", self.port, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=self.start_timeout), master_listen_fd=listener.fileno())
        listener.detach()  # the store owns the socket now
        self._ctx = mp.get_context("forkserver")
        self._ctx.set_forkserver_preload(preload())
        self._reaper = Reaper()
        self._reaper.remove_at_end(self._tmp.name)
        _open_pools.add(self)
        try:
            self.new_generation()
        except BaseException:
            self.close()
            raise
        settle_heap()

    def new_generation(self) -> Generation:
        spare, self.spare = self.spare, None
        generation = spare or self._launch()
        self.generation = generation
        generation.launched()
        generation.await_ready(self.start_timeout)
        if self.after_start is not None:
            self.after_start(generation)
        self._kept_keys = self._store_keys()  # the world's own keys; what later work adds is its alone
        if spare is not None:
            self.spares_used += 1
            if self.spares_used > 1:  # hangs come often here (divergent plans): keep the next one ready too
                self.prepare_spare()
        return generation

    def _launch(self, behind: bool = False) -> Generation:
        assert self._tmp is not None
        self.generations_started += 1
        number = self.generations_started
        generation = Generation(number)
        generation.launch(self._ctx, self.specs(number, self._tmp.name, self.port), self._reaper, target=self.target,
                          behind=behind)
        return generation

    def prepare_spare(self) -> None:
        """Start the generation that will replace the running one, and let it join its world while the running one
        works: a run the model says hangs costs its replacement's start (seconds on a loaded machine: the ranks are
        forked one after another and the world's first group waits for the last) only once it is over. It is
        forked from a thread of its own, meanwhile. A spare that is not needed waits for the next hang."""
        if self.spare is None and self.store is not None:
            self.spare = self._launch(behind=True)

    def current(self) -> Generation:
        """The running generation; a fresh one if a worker died between runs (killed from outside)."""
        if self.store is None:
            raise ClusterError("the cluster is not started (use `with Cluster(...)` or .start())")
        if self.generation is not None and not all(w.alive for w in self.generation.workers):
            self.restart()
        if self.generation is None:
            return self.new_generation()
        return self.generation

    def restart(self) -> None:
        """Kill the workers; fresh ones start for the next run."""
        if self.generation is not None:
            self.generation.kill()
            if self.store is not None:
                prefix = f"g{self.generation.number}/"
                self._forget_keys(lambda key: not key.startswith(prefix))
            self.generation = None
            self._kept_keys = None

    def refresh(self) -> None:
        """After a hang or a death: kill the workers and start fresh ones now, so the cluster is ready when the
        caller gets the result. A fresh generation that cannot start is left for the next run to report."""
        self.restart()
        try:
            self.new_generation()
        except ClusterError as exc:
            if isinstance(exc, SetupError):
                raise
            self.generation = None

    def forget_work_keys(self) -> None:
        """Delete the store keys the last runs' groups left, every FORGET_EVERY runs. Every new_group leaves
        rendezvous keys in the store, which lives in this process: a long sweep would otherwise grow it by
        kilobytes a plan. (Names never repeat, so a key left a while misleads no later group; deleting them after
        every plan, one store round trip a key, was a fiftieth of a sweep's time.) Call only once every rank has
        finished the run (no group of it is still connecting)."""
        self._runs_unforgotten += 1
        if self._runs_unforgotten < FORGET_EVERY:
            return
        self._runs_unforgotten = 0
        kept = self._kept_keys
        if kept is not None:
            spare = f"g{self.spare.number}/" if self.spare is not None else None  # (joining its world meanwhile)
            self._forget_keys(lambda key: key in kept or (spare is not None and key.startswith(spare)))

    def _store_keys(self) -> set[str] | None:
        lister = getattr(self.store, "list_keys", None)
        return set(lister()) if lister is not None else None

    def _forget_keys(self, keep: Callable[[str], bool]) -> None:
        for key in self._store_keys() or ():
            if not keep(key):
                self.store.delete_key(key)

    def close(self) -> None:
        if self.spare is not None:
            self.spare.stop()
            self.spare = None
        if self.generation is not None:
            self.generation.stop()
            self.generation = None
        self.store = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None
        _open_pools.discard(self)

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.generation.workers] if self.generation else []

    def file(self, name: str) -> str:
        assert self._tmp is not None
        return os.path.join(self._tmp.name, name)


class Pooled:
    """An executor whose ranks live in a WorkerPool: starting, closing and restarting them is the pool's."""

    pool: WorkerPool

    @property
    def pids(self) -> list[int]:
        return self.pool.pids

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> Self:
        self.pool.start()
        return self

    def close(self) -> None:
        self.pool.close()

    def restart(self) -> None:
        """Kill the workers; fresh ones start for the next run."""
        self.pool.restart()


_settled = False


def settle_heap() -> None:
    """Once torch is imported and the first workers run: the controller's heap (torch's modules, a few hundred
    thousand objects) leaves the garbage collector's view (gc.freeze), so that the collections that follow each
    run's own objects do not walk it again and again (a full collection of it takes a quarter of a second)."""
    global _settled
    if not _settled:
        _settled = True
        gc.collect()
        gc.freeze()


def close_all(kill: bool = False) -> None:
    """Close every pool of this process (at exit; with kill=True, when a signal ends the run: no goodbyes)."""
    if kill:
        _kill_forkserver()
    for pool in list(_open_pools):
        try:
            if kill:
                pool.restart()
            pool.close()
        except Exception:
            pass


def _kill_forkserver() -> None:
    """SIGKILL the forkserver and wait for it. Every rank it forked dies with it (PR_SET_PDEATHSIG, set first thing
    in a rank), whether or not a generation lists it yet: a signal that landed inside a rank's start left that rank
    running on after the run's files were removed."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if not pid:
        return
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except OSError:
        pass


import atexit  # noqa: E402

atexit.register(close_all)
