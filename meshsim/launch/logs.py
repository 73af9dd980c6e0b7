"""Where the output of `meshsim launch`'s ranks goes: the console, meshsim's log file a rank, and torchrun's files.

On the console every line is prefixed "[rankN]:". Output arrives in pieces that need not end at a line's end
(print writes its parts one by one), so a line is shown only once it is complete. With `--log-dir DIR` each
rank's whole output is kept in DIR/rankN.log.

torchrun's routing is torch's own: each simulated host is a node whose log directory is DIR/host<h> (a temporary
directory when no --log-dir is given), and torchrun's LogsSpecs (its default, or the one --logs-specs names) lays
out `<run id>_<suffix>/attempt_<restart>/<local rank>/{stdout,stderr}.log` and `error.json` there. What it
returns decides, for each local rank and stream, what reaches the console: a redirected stream goes to its file
only, a tee'd one to both, and --local-ranks-filter hides the console output of the local ranks it leaves out.
Lines of tee'd streams that match --duplicate-stdout/stderr-filters are copied to the attempt's
filtered_stdout.log / filtered_stderr.log with torchrun's "[<role><local rank>]:" prefix.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, TextIO

from ..spec.topology import Topology
from .options import LaunchOptions, logs_specs_class, streams

CONSOLE = ""  # torchrun's LogsDest value for "the console" (its SYS_STREAM)


class RankLogs:
    """The echo a launch's executor calls with each piece of a rank's output: echo(rank, text, stream), stream
    being "stdout", "stderr", or "output" (both, as written, where the launch keeps them together)."""

    def __init__(self, topology: Topology, options: LaunchOptions, log_dir: str | None, stdout: TextIO | None,
                 stderr: TextIO | None):
        self.topology, self.options, self.log_dir = topology, options, log_dir
        self.console = {"stdout": stdout, "stderr": stderr, "output": stdout}
        self.partial: dict[tuple[int, str], str] = {}
        self.torchrun_dir: str | None = None  # the base of torchrun's layout, once made
        self.specs: list[Any] = []  # a LogsSpecs a host, kept across attempts (one run directory each)
        self.routes: dict[tuple[int, str], tuple[bool, str | None, str | None]] = {}
        if log_dir is not None:
            os.makedirs(log_dir, exist_ok=True)
            for rank in range(topology.world):
                open(os.path.join(log_dir, f"rank{rank}.log"), "w").close()  # one file a rank, silent ones too

    @property
    def torchruns_layout(self) -> bool:
        """Whether torchrun would write files here (a log dir, redirects, tee, a filter, another LogsSpecs)."""
        o = self.options
        return self.log_dir is not None or bool(streams(o.redirects, "--redirects") or streams(o.tee, "--tee")) or \
            bool(o.local_ranks_filter) or o.logs_specs is not None

    def attempt(self, restart_count: int, envs: list[dict[str, str | None]]) -> None:
        """Lay out this attempt's files (torch's LogsSpecs.reify, host by host) and route every rank's streams;
        `envs` (one a rank) get TORCHELASTIC_ERROR_FILE as torchrun sets it: always, in a temporary directory
        when no --log-dir is given (@record writes error.json there). Without torchrun's layout (no log dir,
        redirect, tee or filter) every stream goes to the console, and close() removes what stayed empty."""
        self.routes.clear()
        if not self.specs:
            self._make_specs()
        per_host = self.topology.devices_per_host
        for host, spec in enumerate(self.specs):
            ranks = range(host * per_host, (host + 1) * per_host)
            local = {r - host * per_host: {k: v or "" for k, v in envs[r].items()} for r in ranks}
            dest = spec.reify(local)
            # (torch before 2.10 has no duplicate filters, and its LogsDest no filtered files)
            for needles, path in ((self.options.duplicate_stdout_filters, getattr(dest, "filtered_stdout", None)),
                                  (self.options.duplicate_stderr_filters, getattr(dest, "filtered_stderr", None))):
                if needles and path is not None and path != os.devnull:
                    open(path, "w").close()  # torchrun opens it when filters are given, matched or not
            for rank in ranks:
                lr = rank - host * per_host
                error_file = local[lr].get("TORCHELASTIC_ERROR_FILE")
                envs[rank]["TORCHELASTIC_ERROR_FILE"] = error_file or None
                if self.torchruns_layout:
                    self._route(rank, lr, dest)

    def _make_specs(self) -> None:
        from torch.distributed.elastic.multiprocessing import Std

        o = self.options
        base = self.log_dir if self.log_dir is not None else tempfile.mkdtemp(prefix="torchelastic_")
        self.torchrun_dir = base
        kind = logs_specs_class(o.logs_specs)
        for host in range(self.topology.hosts):
            self.specs.append(kind(log_dir=os.path.join(base, f"host{host}"), redirects=Std.from_str(o.redirects),
                                   tee=Std.from_str(o.tee), local_ranks_filter=set(o.local_ranks_filter) or None))

    def _route(self, rank: int, local_rank: int, dest: Any) -> None:
        """(to the console, to this file, lines matching a filter to that file) for each stream of the rank."""
        o = self.options
        for stream, files, tees, filtered, needles in (
                ("stdout", dest.stdouts, dest.tee_stdouts, dest.filtered_stdout, o.duplicate_stdout_filters),
                ("stderr", dest.stderrs, dest.tee_stderrs, dest.filtered_stderr, o.duplicate_stderr_filters)):
            target = files.get(local_rank, CONSOLE)
            shown = target == CONSOLE or local_rank in tees
            to_file = target if target not in (CONSOLE, os.devnull) else None
            copy = filtered if needles and local_rank in tees and filtered != os.devnull else None
            self.routes[(rank, stream)] = (shown, to_file, copy)
        self.routes[(rank, "output")] = self.routes[(rank, "stdout")]

    def close(self) -> None:
        """A temporary layout (no --log-dir) that holds no file is removed: torchrun would leave its empty
        directories behind, a launch a time."""
        import shutil

        base = self.torchrun_dir
        if base is None or self.log_dir is not None:
            return
        if not any(files for _, _, files in os.walk(base)):
            shutil.rmtree(base, ignore_errors=True)
            self.torchrun_dir = None

    # ------------------------------------------------------------------ the echo

    def __call__(self, rank: int, text: str, stream: str = "output") -> None:
        if self.log_dir is not None:
            _append(os.path.join(self.log_dir, f"rank{rank}.log"), text)
        shown, to_file, copy = self.routes.get((rank, stream), (True, None, None))
        if to_file is not None:
            _append(to_file, text)
        key = (rank, stream)
        *lines, self.partial[key] = (self.partial.get(key, "") + text).split("\n")
        self._show(rank, stream, lines, shown, copy)

    def flush(self) -> None:
        """Show what is left of every rank's last line (at the end of an attempt)."""
        for (rank, stream), rest in sorted(self.partial.items()):
            if rest:
                shown, _, copy = self.routes.get((rank, stream), (True, None, None))
                self._show(rank, stream, [rest], shown, copy)
        self.partial.clear()

    def _show(self, rank: int, stream: str, lines: list[str], shown: bool, copy: str | None) -> None:
        if not lines:
            return
        console = self.console[stream]
        if shown and console is not None:
            console.write("".join(f"[rank{rank}]:{line}\n" for line in lines))
            console.flush()
        if copy is not None:
            needles = self.options.duplicate_stdout_filters if stream == "stdout" else \
                self.options.duplicate_stderr_filters
            local_rank = self.topology.local_rank(rank)
            kept = [line for line in lines if any(needle in line for needle in needles)]
            if kept:
                _append(copy, "".join(f"[{self.options.role}{local_rank}]:{line}\n" for line in kept))


def _append(path: str, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)
