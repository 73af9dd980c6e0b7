"""`meshsim launch`'s command line: torchrun's own parser, and what each of its flags means on a simulated cluster.

The flags are read by torch.distributed.run's parser itself, so every form torchrun takes (dash and underscore
spellings, `=` forms, `-r`/`-t`, defaults from PET_* variables) means what it means there. Then each one is
mapped onto the simulated cluster, or refused in one line when meshsim cannot honour it:

- `--nnodes N` or `MIN:MAX` (run at MAX: every simulated host joins); `--nproc-per-node N|gpu|auto|cpu`, where
  gpu and auto mean the simulated host's GPUs (`--devices-per-host`, default GPUS_PER_HOST) and cpu this
  machine's CPUs, as torchrun counts them;
- `--max-restarts`, `--role`, `--rdzv-id` (TORCHELASTIC_RUN_ID; a fresh one with `--standalone`), `--rdzv-conf`
  (checked by torch's parser; `join_timeout` bounds the ranks' start), `--redirects`, `--tee`,
  `--local-ranks-filter`, `--duplicate-*-filters`, `--log-dir`, `--logs-specs`, `--virtual-local-rank`,
  `-m`, `--run-path` (meshsim always runs the script in the rank's interpreter);
- accepted with no effect, since they place real processes on real machines: the other rendezvous flags,
  `--node-rank`, `--master-addr`/`--master-port` (meshsim runs every node, on loopback), `--monitor-interval`,
  `--start-method`, `--event-log-handler`, `--local-addr`, `--numa-binding`, `--signals-to-handle`,
  `--shutdown-timeout`;
- refused: `--no-python` (a rank is a Python process of meshsim's: the simulated GPUs, the progress hooks and
  the diagnosis live in it), `--nproc-per-node xpu` (or another accelerator: the simulated devices are CUDA's).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

from ..core import deadlines
from ..core.errors import InputError
from ..spec.topology import Topology

GPUS_PER_HOST = 8  # `--nproc-per-node gpu` without --devices-per-host: the GPUs of a common server (HGX, DGX)


class LaunchError(InputError):
    """Bad usage of launch (a flag meshsim cannot honour, a script that does not exist); nothing was started."""


@dataclass(frozen=True)
class LaunchOptions:
    """What torchrun's flags ask of a launch, beyond the topology (the keyword arguments of meshsim.launch).

    max_restarts: restart every rank after a failure, up to this many times (TORCHELASTIC_RESTART_COUNT);
    host_dirs: each simulated host h works in host_dirs/host<h> (its own disk); gpus_per_host: the GPUs each
    simulated host shows (None: one a rank); run_id, role: TORCHELASTIC_RUN_ID and ROLE_NAME; redirects, tee,
    local_ranks_filter, duplicate_*_filters, logs_specs: torchrun's log routing; virtual_local_rank: every rank
    sees LOCAL_RANK=0 and its one GPU as device 0; start_timeout: how long the ranks may take to join; gpu: the
    card a simulated GPU is ("h100-80gb", "a100-40gb", "a100-80gb", "h200-141gb" or bytes: its memory).
    """

    max_restarts: int = 0
    host_dirs: str | None = None
    gpus_per_host: int | None = None
    run_id: str | None = None  # None: as torchrun picks it (a fresh uuid4 on one node)
    role: str = "default"
    redirects: str = "0"
    tee: str = "0"
    local_ranks_filter: tuple[int, ...] = ()
    duplicate_stdout_filters: tuple[str, ...] = ()
    duplicate_stderr_filters: tuple[str, ...] = ()
    logs_specs: str | None = None
    virtual_local_rank: bool = False
    start_timeout: float = deadlines.START_S
    gpu: str | None = None  # the card each simulated GPU is (meshsim.compat.simgpu.gpus; None: an H100 80GB)
    # torchrun's launcher exports its --signals-to-handle to the workers' environment (TORCHELASTIC_SIGNALS_TO_HANDLE)
    signals_to_handle: str = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"

    def __post_init__(self) -> None:
        if self.gpu is not None:
            from ..compat.simgpu.gpus import GPUError, gpu_of

            try:
                gpu_of(self.gpu)
            except GPUError as exc:
                raise LaunchError(str(exc)) from None
        if not _count(self.max_restarts, 0):
            raise LaunchError(f"--max-restarts must be 0 or more, got {self.max_restarts!r}")
        if self.gpus_per_host is not None and not _count(self.gpus_per_host, 1):
            raise LaunchError(f"--devices-per-host must be a positive number, got {self.gpus_per_host!r}")
        if self.host_dirs is not None and os.path.exists(self.host_dirs) and not os.path.isdir(self.host_dirs):
            raise LaunchError(f"--host-dirs {self.host_dirs}: not a directory")
        for flag, value in (("--redirects", self.redirects), ("--tee", self.tee)):
            streams(value, flag)
        if not all(_count(r, 0) for r in self.local_ranks_filter):
            raise LaunchError(f"--local-ranks-filter takes local ranks, got {list(self.local_ranks_filter)}")
        deadlines.checked(self.start_timeout, "the start timeout (--rdzv-conf join_timeout)")
        if self.logs_specs is not None:
            logs_specs_class(self.logs_specs)

    @property
    def split_streams(self) -> bool:
        """Whether a rank's stdout and stderr must be kept apart (torchrun's files are one a stream)."""
        return streams(self.redirects, "--redirects") != {} or streams(self.tee, "--tee") != {} or \
            self.logs_specs is not None


def _count(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def streams(value: str, flag: str) -> dict[int, Any]:
    """torchrun's "3" or "0:1,1:2" (torch's Std.from_str) as {local rank: streams} for the ranks that name any;
    {} when none do. A single value is keyed -1: every local rank."""
    from torch.distributed.elastic.multiprocessing import Std

    try:
        parsed = Std.from_str(str(value))
    except (ValueError, KeyError) as exc:
        raise LaunchError(f"{flag} {value}: expected 0-3 (1 stdout, 2 stderr, 3 both) or LOCAL_RANK:N,... "
                          f"({exc})") from None
    if isinstance(parsed, dict):
        return {rank: std for rank, std in parsed.items() if std}
    return {-1: parsed} if parsed else {}


def logs_specs_class(name: str | None) -> Any:
    """torchrun's LogsSpecs class: its default, or one registered under the `torchrun.logs_specs` entry point."""
    from torch.distributed.run import _get_logs_specs_class

    try:
        return _get_logs_specs_class(name)
    except ValueError as exc:
        raise LaunchError(f"--logs-specs {name}: {exc}") from None


# --------------------------------------------------------------------------------------------- the command line

MESHSIM_HELP = {
    "log_dir": "write each rank's output to DIR/rankN.log, and torchrun's layout for each simulated host under "
               "DIR/host<h>/ (--redirects/--tee files, error.json); a hang also leaves hang.svg, hang.html and "
               "DIR/flight_recorder/",
    "nnodes": "simulated hosts, N or MIN:MAX (run at MAX: every simulated host joins; default 1)",
    "nproc_per_node": "ranks per host: N, or gpu/auto (the simulated host's GPUs, --devices-per-host) or cpu (this "
                      "machine's CPUs), as torchrun counts them (default 1, or --devices-per-host)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """torchrun's own arguments (torch.distributed.run.get_args_parser), then meshsim's."""
    from torch.distributed.run import get_args_parser

    torchrun = get_args_parser()
    for action in torchrun._actions:
        if action.dest in MESHSIM_HELP:
            action.help = MESHSIM_HELP[action.dest]
        if action.dest == "nproc_per_node" and "PET_NPROC_PER_NODE" not in os.environ:
            action.default = None  # not given: one a simulated device (--devices-per-host), else torchrun's 1
    parser._add_container_actions(torchrun)
    parser.add_argument("--hosts", dest="nnodes", help="the same as --nnodes")
    parser.add_argument("--devices-per-host", type=int, default=None, metavar="D",
                        help=f"GPUs each simulated host has (torch.cuda.device_count() on its ranks); default: one a "
                             f"rank, or {GPUS_PER_HOST} with --nproc-per-node gpu or auto")
    parser.add_argument("--gpu", metavar="CARD", default=None,
                        help="the card each simulated GPU is: h100-80gb (default), a100-40gb, a100-80gb, h200-141gb, "
                             "or a number of bytes (its memory); its capacity is where CUDA's out-of-memory error "
                             "comes")
    parser.add_argument("--host-dirs", metavar="DIR",
                        help="give each simulated host its own disk: the ranks of host h run in DIR/host<h> (made if "
                             "missing, kept afterwards), so relative paths, like a checkpoint that local rank 0 "
                             "writes, resolve there, and TMPDIR is DIR/host<h>/tmp")
    parser.add_argument("--deadline", type=float, default=deadlines.LAUNCH_S,
                        help=f"seconds each attempt of the script may run before a rank still waiting is called a "
                             f"hang (default {deadlines.LAUNCH_S:g})")
    parser.add_argument("--groups", action="store_true", help="print the map of process groups the script created")


@dataclass(frozen=True)
class LaunchRequest:
    """A `meshsim launch` command line, mapped: what to run, where, and how."""

    target: str
    is_module: bool
    args: list[str]
    topology: Topology
    deadline: float
    log_dir: str | None
    options: LaunchOptions
    groups: bool = False
    notes: tuple[str, ...] = ()  # what a flag was taken to mean, where torchrun's answer depends on the machine


def request_of(ns: argparse.Namespace) -> LaunchRequest:
    """Map torchrun's parsed flags (and meshsim's) onto a simulated cluster; LaunchError for what cannot be."""
    if ns.no_python:
        raise LaunchError("--no-python: meshsim runs a Python script or module (-m) in its own rank processes, "
                          "where the simulated GPUs, the progress hooks and the diagnosis live; it cannot run a "
                          "program directly")
    least, hosts = _hosts(ns.nnodes)
    ranks, gpus = _per_host(ns.nproc_per_node, ns.devices_per_host)
    notes = []
    if least < hosts:
        notes.append(f"--nnodes {ns.nnodes}: {hosts} simulated hosts (every host joins, as at MAX)")
    if str(ns.nproc_per_node).strip().lower() in ("gpu", "auto", "cpu"):
        notes.append(f"--nproc-per-node {ns.nproc_per_node}: {ranks} ranks a host, on hosts of {gpus} simulated GPUs"
                     + ("" if ns.devices_per_host else " (--devices-per-host D chooses)"))
    start_timeout = _rendezvous(ns.rdzv_conf)
    options = LaunchOptions(
        max_restarts=_nonnegative(ns.max_restarts, "--max-restarts"), host_dirs=ns.host_dirs,
        gpus_per_host=gpus if gpus != ranks else None,
        run_id=_run_id(ns, hosts), role=ns.role,
        redirects=ns.redirects, tee=ns.tee, local_ranks_filter=_local_ranks(ns.local_ranks_filter),
        duplicate_stdout_filters=_since_2_10(ns, "duplicate_stdout_filters"),
        duplicate_stderr_filters=_since_2_10(ns, "duplicate_stderr_filters"),
        logs_specs=ns.logs_specs, virtual_local_rank=bool(getattr(ns, "virtual_local_rank", False)),
        start_timeout=start_timeout, gpu=ns.gpu,
        **({"signals_to_handle": ns.signals_to_handle} if getattr(ns, "signals_to_handle", None) else {}))
    deadline = deadlines.checked(ns.deadline)
    return LaunchRequest(ns.training_script, bool(ns.module), list(ns.training_script_args), Topology(hosts, ranks),
                         deadline, ns.log_dir, options, bool(ns.groups), tuple(notes))


def _hosts(nnodes: str) -> tuple[int, int]:
    """`--nnodes N` or `MIN:MAX` (torch's parse_min_max_nnodes): (MIN, MAX); a launch runs at MAX."""
    from torch.distributed.run import parse_min_max_nnodes

    try:
        least, most = parse_min_max_nnodes(str(nnodes))
    except (ValueError, RuntimeError):
        raise LaunchError(f"--nnodes {nnodes}: expected a number of hosts, or MIN:MAX") from None
    if not 0 < least <= most:
        raise LaunchError(f"--nnodes {nnodes}: needs 0 < MIN <= MAX")
    return least, most


def _per_host(nproc: str | None, devices: int | None) -> tuple[int, int]:
    """(ranks per host, GPUs per host) from --nproc-per-node and --devices-per-host."""
    if devices is not None and devices < 1:
        raise LaunchError(f"--devices-per-host must be a positive number, got {devices}")
    if nproc is None:
        return devices or 1, devices or 1
    word = str(nproc).strip().lower()
    if word in ("gpu", "auto"):  # the accelerator of a simulated host is its simulated GPUs
        gpus = devices or GPUS_PER_HOST
        return gpus, gpus
    if word == "cpu":
        from torch.distributed.run import determine_local_world_size

        count = determine_local_world_size("cpu")
        return count, devices or count
    try:
        count = int(word)
    except ValueError:
        raise LaunchError(f"--nproc-per-node {nproc}: meshsim simulates CUDA GPUs; use a number, gpu, auto or "
                          "cpu") from None
    if count < 1:
        raise LaunchError(f"--nproc-per-node must be a positive number, got {nproc}")
    return count, devices or count


def _rendezvous(conf: str) -> float:
    """--rdzv-conf, read by torch's own parser; `join_timeout` (seconds) bounds how long the ranks may take to
    join. The other keys tune a real rendezvous, which simulated hosts do not need."""
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

    try:
        config = _parse_rendezvous_config(conf or "")
    except ValueError as exc:
        raise LaunchError(f"--rdzv-conf {conf}: {exc}") from None
    if "join_timeout" not in config:
        return deadlines.START_S
    try:
        return deadlines.checked(float(config["join_timeout"]), "--rdzv-conf join_timeout")
    except ValueError:
        raise LaunchError(f"--rdzv-conf join_timeout={config['join_timeout']}: expected seconds") from None


def _local_ranks(text: str) -> tuple[int, ...]:
    """--local-ranks-filter 0,1,2 (torchrun's format); empty: every rank."""
    if not text:
        return ()
    try:
        ranks = tuple(sorted({int(part) for part in text.split(",")}))
    except ValueError:
        raise LaunchError(f"--local-ranks-filter {text}: expected a comma-separated list of local ranks, "
                          "e.g. 0,1,2") from None
    if any(r < 0 for r in ranks):
        raise LaunchError(f"--local-ranks-filter {text}: local ranks are 0 or more")
    return ranks


def _nonnegative(value: int, flag: str) -> int:
    if value < 0:
        raise LaunchError(f"{flag} must be 0 or more, got {value}")
    return value


def _run_id(ns: argparse.Namespace, hosts: int) -> str:
    """TORCHELASTIC_RUN_ID as torchrun sets it (torch.distributed.run.run): a fresh uuid4 with --standalone, and on
    one node of static rendezvous given no endpoint and no port; else --rdzv-id."""
    import uuid

    if ns.standalone or (ns.rdzv_backend == "static" and not ns.rdzv_endpoint and ns.master_port is None and
                         hosts == 1):
        return str(uuid.uuid4())
    return str(ns.rdzv_id)


def _since_2_10(ns: argparse.Namespace, flag: str) -> tuple[str, ...]:
    """A filter flag torchrun's parser has from 2.10 on (an older torchrun has no such flag: nothing to filter)."""
    return tuple(f for f in getattr(ns, flag, None) or () if f)
