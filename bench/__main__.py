"""meshsim's benchmarks in one run: every section next to its anchor (a baseline measured in the same run), ratios,
goals, and the machine's load beside each figure.

    python -m bench                          every section: process, thread, fake, model, sweep, launch, memory,
                                             torchtitan
    python -m bench sweep                    the property sweep at W = 8: marginal examples/s (goal >= 25/s), with
                                             and without DTensor steps, next to the raw torch loop; seconds for a
                                             default sweep to find and shrink each seeded bug (bench/sweep.py)
    python -m bench thread model --quick     some sections, shorter (fewer rounds, sampled ranks, fewer plans)
    python -m bench --json bench.json        also write the figures with the machine, torch's version, the commit
    python -m bench --compare old.json       and say what moved since an earlier run's JSON
    python -m bench mutants                  mutation testing of torch's DeviceMesh and DTensor files against a
                                             default sweep (about an hour; not in the default run; bench/mutants.py)

Timings on a shared machine are noisy: compare ratios taken in the same run, and the load column.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
# The sections are plain modules of this folder (bench/bench.py imports them the same way), and the ranks meshsim
# and the baselines start import them by these names: the folder goes first on the path.
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "tests")]

import fake  # noqa: E402
import memory  # noqa: E402
import model  # noqa: E402
import mutants  # noqa: E402
import process  # noqa: E402
import sweep  # noqa: E402
import thread  # noqa: E402
import titan  # noqa: E402
from figures import Figure, compare, machine, table, write  # noqa: E402
from rich.console import Console  # noqa: E402


def launch(quick: bool = False) -> list[Figure]:
    """`meshsim launch` next to torchrun (bench/launch_vs_torchrun.py; its figures, where it gives them, else its
    own tables)."""
    import launch_vs_torchrun

    figures = getattr(launch_vs_torchrun, "launch_figures", None)
    if figures is not None:
        return list(figures(quick))
    launch_vs_torchrun.launch_section(Console(width=200), rounds=1 if quick else 3)
    return []


SECTIONS = {"process": process.run, "thread": thread.run, "fake": fake.run, "model": model.run, "sweep": sweep.run,
            "launch": launch, "memory": memory.run, "torchtitan": titan.run, "mutants": mutants.run}
DEFAULT = [name for name in SECTIONS if name != "mutants"]  # an hour of sweeps: asked for by name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("sections", nargs="*", choices=[[], *SECTIONS], metavar="SECTION",
                        help=f"some of: {', '.join(SECTIONS)} (default: all but mutants)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds, sampled ranks, fewer plans")
    parser.add_argument("--json", metavar="FILE", help="write the figures here")
    parser.add_argument("--compare", metavar="FILE", help="an earlier run's --json: say what moved")
    args = parser.parse_args(argv)
    console = Console(width=200)
    console.print(f"machine: {machine()}")
    figures: list[Figure] = []
    failed = []
    for name in args.sections or DEFAULT:
        started = time.monotonic()
        console.print(f"[bold]{name}[/] (load {os.getloadavg()[0]:.1f}) ...")
        try:
            found = SECTIONS[name](args.quick)
        except Exception:  # noqa: BLE001 -- one broken section must not lose the others' figures
            failed.append(name)
            console.print(f"[red]{name} failed[/]\n{traceback.format_exc()}")
            continue
        figures.extend(found)
        console.print(table(found, f"{name} ({time.monotonic() - started:.0f} s)"))
    console.print(table(figures, "every figure"))
    if args.json:
        write(args.json, figures)
        console.print(f"figures written to {args.json}")
    if args.compare:
        compare(args.compare, figures, console)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
