"""What every case script shares: gloo, and a Flight Recorder dump when the job hangs.

gloo has no watchdog, so nothing dumps Flight Recorder on a timeout the way NCCL does with
TORCH_NCCL_DUMP_ON_TIMEOUT. This stands in for NCCL's watchdog, and does what it does:

- a thread per rank looks at the rank's own in-flight collectives (`retired` is False) every 0.2 s;
- the first rank with one in flight longer than FRCASE_TIMEOUT_S seconds (default 10) raises the alarm
  through the job's store, as NCCL's watchdog signals its peers to dump;
- every rank that sees the alarm, gets SIGTERM (torchrun's teardown) or raises, writes
  `torch._C._distributed_c10d._dump_fr_trace()` to TORCH_FR_DUMP_TEMP_FILE + global rank, NCCL's file
  name; it leaves once every rank has written its dump (at most FRCASE_LEAVE_S, default 90 s, later), since a
  rank that left earlier would close its gloo connections and turn its peers' waits into errors;
- a rank that finishes its script stays up until then, so that a finished rank has a dump too;
- FRCASE_CAP_S (default 120) bounds every run: at that age each rank dumps and leaves, alarm or not.

A rank that leaves with os._exit() writes nothing, as a dead rank on a real cluster writes nothing.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

ALARM = "frcase/dump"
DUMPED = "frcase/dumped"
_claimed = threading.Lock()  # the first path to dump (alarm, SIGTERM, exception, cap) writes it
_written = threading.Event()


def _dump(reason: str) -> None:
    """Write this rank's dump once; any later caller waits until it is on disk (a dump with stacks can take
    seconds on a loaded machine, and a rank that left meanwhile would leave a half-written file)."""
    if not _claimed.acquire(blocking=False):
        _written.wait(float(os.environ.get("FRCASE_LEAVE_S", "90")))
        return
    path = os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(dist.get_rank())
    began = time.monotonic()
    blob = torch._C._distributed_c10d._dump_fr_trace()
    with open(path + ".tmp", "wb") as f:
        f.write(blob)
    os.replace(path + ".tmp", path)  # never a half-written dump under the real name
    _written.set()
    print(f"[frcase] rank {dist.get_rank()} dumped {len(pickle.loads(blob)['entries'])} entries ({reason}; "
          f"{time.monotonic() - began:.1f} s)",
          flush=True)


_leaving = threading.Lock()


def _leave(store: dist.Store, code: int) -> None:
    """Exit once every rank has dumped (a dead rank never will: bounded). Both of a rank's threads may get
    here (an exception and the alarm): the first one counts the rank and leaves, the other waits for it."""
    if not _leaving.acquire(blocking=False):
        threading.Event().wait()
    store.add(DUMPED, 1)
    until = time.monotonic() + float(os.environ.get("FRCASE_LEAVE_S", "90"))
    while store.add(DUMPED, 0) < dist.get_world_size() and time.monotonic() < until:
        time.sleep(0.1)
    sys.stdout.flush()
    os._exit(code)


def _oldest_in_flight_s() -> float:
    trace = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(includeStackTraces=False, onlyActive=True))
    now = time.time_ns()
    ages = [(now - e["time_created_ns"]) / 1e9 for e in trace["entries"] if not e["retired"]]
    return max(ages, default=0.0)


def _watch(store: dist.Store, timeout_s: float, cap_s: float, started: float, wakeup: int) -> None:
    while True:
        # the wait doubles as the poll interval and as the only place SIGTERM is taken (see run())
        if select.select([wakeup], [], [], 0.2)[0] and signal.SIGTERM in os.read(wakeup, 64):
            _dump("SIGTERM")
            os._exit(143)  # torchrun is tearing the job down: nobody waits for the others
        if time.monotonic() - started > cap_s:
            _dump(f"cap of {cap_s:g} s")
            _leave(store, 0)
        if store.check([ALARM]):
            _dump(f"alarm from rank {store.get(ALARM).decode()}")
            _leave(store, 0)
        if _oldest_in_flight_s() > timeout_s:
            store.set(ALARM, str(dist.get_rank()))


def run(main) -> None:
    """Run main() on this rank under the stand-in watchdog; never returns."""
    # A Python signal handler runs only once the main thread leaves the C++ collective it hangs in, and the
    # signal may land on any of torch's threads: Python's own C handler writes the signal's number to the
    # wakeup pipe whichever thread takes it, and the watcher reads it there.
    wakeup, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.set_wakeup_fd(write_end)
    started = time.monotonic()
    dist.init_process_group("gloo")
    timeout_s = float(os.environ.get("FRCASE_TIMEOUT_S", "10"))
    cap_s = float(os.environ.get("FRCASE_CAP_S", "120"))
    store = dist.distributed_c10d._get_default_store()
    threading.Thread(target=_watch, args=(store, timeout_s, cap_s, started, wakeup), daemon=True).start()
    try:
        main()
    except Exception:  # noqa: BLE001 - whatever the script raises, its rank dumps before it goes
        if _claimed.locked():
            os._exit(0)  # a peer left after the dumps were written: the job is over, not failing anew
        traceback.print_exc()
        _dump("exception")
        _leave(store, 1)
    threading.Event().wait()  # finished: stay up until the alarm, SIGTERM or the cap
