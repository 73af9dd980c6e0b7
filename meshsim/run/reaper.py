"""The reaper: a tiny process that outlives the controller by design, so that no rank outlives the run.

Every worker leads its own process group, so whatever a rank starts (a subprocess, an os.fork) is in that group.
The controller tells the reaper each group it makes ("+pgid"), each it has cleaned up itself ("-pgid"), and the
run's folder ("@path"). When the controller's pipe closes, whether it closed the cluster or was SIGKILLed, the
reaper SIGKILLs every group it still knows, removes the folder and exits. It imports nothing of meshsim or torch:
it starts in milliseconds and cannot hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

# Run as `python -I -S -c CODE`: standard library only, reads the controller's lines until end of file.
CODE = r"""
import os, shutil, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
groups, folders = set(), set()
for line in sys.stdin:
    line = line.rstrip("\n")
    if line[:1] == "+":
        groups.add(int(line[1:]))
    elif line[:1] == "-":
        groups.discard(int(line[1:]))
    elif line[:1] == "@":
        folders.add(line[1:])
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
for folder in folders:
    shutil.rmtree(folder, ignore_errors=True)
"""


class Reaper:
    def __init__(self) -> None:
        # Its own session: a Ctrl-C to the controller's terminal must not take the reaper down before it reaps.
        self.process = subprocess.Popen([sys.executable, "-I", "-S", "-c", CODE], stdin=subprocess.PIPE,
                                        text=True, start_new_session=True, close_fds=True)

    def _say(self, line: str) -> None:
        assert self.process.stdin is not None  # Popen(stdin=PIPE)
        try:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def watch(self, pgid: int) -> None:
        self._say(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        self._say(f"-{pgid}")

    def remove_at_end(self, folder: str) -> None:
        """The run's files go too, at the end, even when the controller was SIGKILLed and could not remove them."""
        self._say(f"@{folder}")

    def close(self) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(5.0)
        except subprocess.TimeoutExpired:
            self.process.kill()


def kill_group(pgid: int) -> None:
    """SIGKILL a rank's process group: the rank and everything it started."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def lead_own_group(own_session: bool = False) -> None:
    """Called first thing in a worker: it and what it starts form one group that can be killed whole.
    `own_session`: in a session of its own too, as torchrun starts each worker (start_new_session). Linux's
    scheduler groups processes by session, and that shows in a script's speed: eight ranks of one session took
    21 ms an all_reduce (77 KB, 2 cores) where ranks each in its own session took 16, as under torchrun. A sweep's
    ranks, which meet through the store between their collectives, ran a README sweep 7% slower so: they stay in
    the controller's session."""
    if own_session:
        os.setsid()
    else:
        os.setpgid(0, 0)


def die_with_parent() -> None:
    """PR_SET_PDEATHSIG: the kernel SIGKILLs this process when its parent dies (no Python, no GIL needed)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
        except OSError:
            pass


def ignore_interrupts_while(start: Any) -> Any:
    """Run start() with SIGINT blocked, so the processes it launches inherit a blocked SIGINT (a Ctrl-C is the
    controller's to handle: it kills them; they must not print tracebacks of their own). Blocked, not ignored: a
    Ctrl-C that comes meanwhile (the forkserver's first start imports torch, seconds) waits and is delivered to
    the controller when start() returns, instead of being lost."""
    import threading
    from multiprocessing import resource_tracker

    if threading.current_thread() is not threading.main_thread():
        return start()
    # The forkserver's first start starts multiprocessing's resource tracker, which unblocks SIGINT (SIG_UNBLOCK,
    # not a restore) once it has spawned: the forkserver, exec'd next, then took a Ctrl-C in its site import and
    # printed a "Fatal Python error" of its own. Started first, out here, the tracker leaves our mask alone.
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
