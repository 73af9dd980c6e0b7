"""Flight Recorder dumps of a hung run, in torch's own format, so that torch's analyzer (and `meshsim replay`)
read a meshsim hang as they read a production one.

torch records every collective of every group in a ring buffer when TORCH_FR_BUFFER_SIZE is set (gloo too, in
torch 2.13), but only NCCL's watchdog writes it on a timeout. A rank here keeps a thread that waits for SIGUSR2
and then writes `_dump_fr_trace()` to DIR/nccl_trace_rank_<rank>, NCCL's file name: the main thread may be stuck
inside a C++ wait, which releases the GIL, so the thread runs. The controller sends the signal to every live rank
of a hung run and waits a moment for the files.
"""

from __future__ import annotations

import os
import signal
import threading
import time

DUMP_SIGNAL = signal.SIGUSR2
PREFIX = "nccl_trace_rank_"  # torch's default TORCH_FR_DUMP_TEMP_FILE name, which its analyzer expects
BUFFER = "2000"  # entries per rank: a training step's collectives, several times over
WAIT_S = 5.0  # how long the controller waits for the dumps (a rank that holds the GIL writes none)


def block_dump_signal() -> None:
    """First thing in a rank, before any thread exists: every thread inherits the block, so the signal waits for
    the one thread that asks for it (unblocked elsewhere, its default action would kill the rank)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {DUMP_SIGNAL})


def arm(directory: str, rank: int) -> None:
    """In a rank: record collectives, and dump them to `directory` when the controller asks."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", BUFFER)

    def serve() -> None:
        signal.sigwait({DUMP_SIGNAL})
        try:
            import torch

            blob = torch._C._distributed_c10d._dump_fr_trace()  # type: ignore[attr-defined]
        except Exception as exc:  # no process group yet, or a torch without the recorder: say so on the rank
            print(f"meshsim: no Flight Recorder dump from rank {rank}: {type(exc).__name__}: {exc}", flush=True)
            return
        path = os.path.join(directory, f"{PREFIX}{rank}")
        with open(path + ".tmp", "wb") as fh:
            fh.write(blob)
        os.replace(path + ".tmp", path)  # never a half-written dump under the real name

    threading.Thread(target=serve, name="meshsim-flight-recorder", daemon=True).start()


def collect(directory: str, pids: dict[int, int]) -> list[int]:
    """Ask the ranks (rank -> pid, the live ones) to dump into `directory`; returns the ranks whose dump came."""
    os.makedirs(directory, exist_ok=True)
    for pid in pids.values():
        try:
            os.kill(pid, DUMP_SIGNAL)
        except ProcessLookupError:
            pass
    end = time.monotonic() + WAIT_S
    written: list[int] = []
    while time.monotonic() < end:
        written = [r for r in pids if os.path.exists(os.path.join(directory, f"{PREFIX}{r}"))]
        if len(written) == len(pids):
            break
        time.sleep(0.05)
    return sorted(written)
