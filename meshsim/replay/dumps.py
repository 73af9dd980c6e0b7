"""A directory of Flight Recorder dumps, one file a rank, read as torch's own loader reads it.

The file of a rank is NCCL's TORCH_FR_DUMP_TEMP_FILE + global rank (default /tmp/nccl_trace_rank_<rank>);
torch's loader (torch.distributed.flight_recorder.components.loader.read_dump) takes the rank from the
digits that end the name, after a prefix common to the directory, and the fields from the pickle. meshsim
does the same, through that loader where this torch has it, and adds what the loader leaves out (pg_status,
comm_lib_version) from the same pickle.

A dump is a pickle, and unpickling runs code a file names: every file is first read by an unpickler that
refuses every global, so only plain data (what Flight Recorder writes) ever reaches pickle.load.

Every problem is a ReplayError: one line that names the file.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import InputError

# torch's loader infers the prefix with this expression: a rank is the digits that end a file name
NAME = re.compile(r"([\w\-\_]*?)(\d+)$")
MAX_DUMP_BYTES = 1 << 30  # Flight Recorder's default buffer (2,000 entries with stacks) is a few MB
MAJOR = 2  # Flight Recorder's format: the minor grows when fields are added, the major when fields change
OLDEST_MINOR = 4  # 2.4: is_p2p, p2p_seq_id, dtypes, retired and pg_config, all of which the replay reads
NEWEST_MINOR = 10  # torch 2.11 to 2.13 write 2.10
NEWEST_KNOWN = f"{MAJOR}.{NEWEST_MINOR}"
ENTRY_KEYS = ("record_id", "pg_id", "process_group", "collective_seq_id", "profiling_name", "input_sizes",
              "output_sizes", "state", "retired")


class ReplayError(InputError):
    """Dumps that cannot be replayed; the message is one line and names the file."""


@dataclass
class Dump:
    path: str
    rank: int
    version: str
    entries: list[dict]
    pg_config: dict
    pg_status: dict = field(default_factory=dict)
    comm_lib_version: str = ""


@dataclass
class DumpSet:
    directory: str
    prefix: str
    dumps: list[Dump]  # in the order the directory lists them, as torch's loader walks it
    version: str
    ignored: list[str] = field(default_factory=list)  # files in the directory that are not dumps
    loader: str = ""  # who read the fields: torch's loader, or meshsim alone where this torch has none

    def by_rank(self) -> dict[int, Dump]:
        return {d.rank: d for d in self.dumps}


class _NamesGlobal(pickle.UnpicklingError):
    pass


class _PlainData(pickle.Unpickler):
    """Flight Recorder writes dicts, lists, tuples, strings, numbers: anything that names a global is not one."""

    def find_class(self, module: str, name: str) -> Any:
        raise _NamesGlobal(f"it names {module}.{name}, which a Flight Recorder dump never does; nothing of it ran")


def read_dir(directory: str) -> DumpSet:
    """Every dump under `directory` (walked as torch's loader walks it); ReplayError for anything unreadable."""
    if not os.path.isdir(directory):
        raise ReplayError(f"{directory}: not a directory of Flight Recorder dumps")
    files: list[tuple[str, str]] = []  # (name, path), in listing order
    for root, dirs, names in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        files.extend((n, os.path.join(root, n)) for n in names if not n.startswith(".") and not n.endswith(".tmp"))
    prefixes: dict[str, list[str]] = {}
    ignored = []
    for name, path in files:
        match = NAME.search(name)
        if match is None or match.start() != 0:
            ignored.append(path)
        else:
            prefixes.setdefault(match.group(1), []).append(path)
    if not prefixes:
        raise ReplayError(f"{directory}: no Flight Recorder dump in it (a dump's name ends with its rank, "
                          f"as in nccl_trace_rank_0)")
    if len(prefixes) > 1:
        ranked = sorted(prefixes.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        odd = ranked[-1][1][0]
        raise ReplayError(f"{odd}: its name prefix {ranked[-1][0]!r} is not the {ranked[0][0]!r} of the other "
                          f"{len(ranked[0][1])} dumps in {directory}: one job's dumps only, please")
    (prefix, paths), = prefixes.items()
    reader, loader = _torch_reader()
    dumps: list[Dump] = []
    seen: dict[int, str] = {}
    for path in paths:
        dump = read_file(path, prefix, reader)
        if dump.rank in seen:
            raise ReplayError(f"{path}: rank {dump.rank} again (also {seen[dump.rank]}): two dumps of one rank, "
                              f"or two jobs in one directory")
        seen[dump.rank] = path
        dumps.append(dump)
    _same_job(dumps)
    return DumpSet(directory, prefix, dumps, dumps[0].version, ignored, loader)


def read_file(path: str, prefix: str, reader: Any = None) -> Dump:
    """One rank's dump; its rank is the number after `prefix` in its name."""
    name = os.path.basename(path)
    if not name.startswith(prefix) or not name[len(prefix):].isdigit():
        raise ReplayError(f"{path}: its name is not {prefix!r} followed by a rank")
    try:
        size = os.path.getsize(path)
        if size > MAX_DUMP_BYTES:
            raise ReplayError(f"{path}: {size} bytes, more than a Flight Recorder dump holds ({MAX_DUMP_BYTES})")
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ReplayError(f"{path}: cannot read ({exc.strerror})") from None
    data = _plain(path, raw)
    version = _version(path, data)
    entries = data["entries"]
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ReplayError(f"{path}: 'entries' is not a list of records")
    for index, entry in enumerate(entries):
        missing = [k for k in ENTRY_KEYS if k not in entry]
        if missing:
            raise ReplayError(f"{path}: entry {index} has no {missing[0]!r}: not a Flight Recorder record")
    rank = int(name[len(prefix):])
    if reader is not None:
        # torch's loader takes the rank and the fields; it only ever sees a file _plain() found to be plain data
        loaded = reader(prefix, path)
        rank, entries, version, pg_config = loaded["rank"], loaded["entries"], loaded["version"], loaded["pg_config"]
    else:
        pg_config = data.get("pg_config", {})
    if not isinstance(pg_config, dict):
        raise ReplayError(f"{path}: 'pg_config' is not a table of groups")
    status = data.get("pg_status", {})
    return Dump(path, rank, str(version), entries, pg_config, status if isinstance(status, dict) else {},
                str(data.get("comm_lib_version", "")))


def _plain(path: str, raw: bytes) -> dict:
    try:
        data = _PlainData(io.BytesIO(raw)).load()
    except RecursionError:
        raise ReplayError(f"{path}: not a Flight Recorder dump (nested too deeply)") from None
    except _NamesGlobal as exc:
        raise ReplayError(f"{path}: refused: {exc}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            OverflowError, UnicodeDecodeError, MemoryError) as exc:  # every way a pickle fails: not a dump
        what = "truncated" if isinstance(exc, EOFError) or "truncated" in str(exc) else "not a pickle"
        raise ReplayError(f"{path}: not a Flight Recorder dump ({what}: {type(exc).__name__}: "
                          f"{str(exc)[:120]})") from None
    if not isinstance(data, dict) or "entries" not in data or "version" not in data:
        raise ReplayError(f"{path}: a pickle, but not a Flight Recorder dump (no 'entries' and 'version')")
    return data


def _version(path: str, data: dict) -> str:
    """The format version, if it is one meshsim knows how to read: a version it does not know may have changed
    what a field means (2.7 began to record the ops of a coalesced call one by one), so it is refused, never
    read as if it were another."""
    version = data["version"]
    parts = str(version).split(".")
    known = f"{MAJOR}.{OLDEST_MINOR} to {NEWEST_KNOWN}; torch 2.11 to 2.13 write {NEWEST_KNOWN}"
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ReplayError(f"{path}: unknown Flight Recorder dump version {str(version)[:40]!r} (meshsim reads {known})")
    major, minor = map(int, parts)
    if major != MAJOR or not OLDEST_MINOR <= minor <= NEWEST_MINOR:
        newer = " (a newer torch wrote it: meshsim needs to learn it first)" \
            if (major, minor) > (MAJOR, NEWEST_MINOR) else ""
        raise ReplayError(f"{path}: unknown Flight Recorder dump version {version} (meshsim reads {known}){newer}")
    return f"{major}.{minor}"


def _same_job(dumps: list[Dump]) -> None:
    """Dumps of one job come from one torch: one format version, one communication library."""
    first = min(dumps, key=lambda d: d.rank)
    for dump in dumps:
        if dump.version != first.version:
            raise ReplayError(f"{dump.path}: version {dump.version}, where {first.path} is {first.version}: "
                              f"dumps from different jobs or torch versions")
        if dump.comm_lib_version != first.comm_lib_version:
            raise ReplayError(f"{dump.path}: communication library {dump.comm_lib_version or 'none'}, where "
                              f"{first.path} has {first.comm_lib_version or 'none'}: dumps from different jobs")


def _torch_reader() -> tuple[Any, str]:
    try:
        from torch.distributed.flight_recorder.components.loader import read_dump
    except ImportError:  # a torch without the analyzer (older, or built without distributed)
        return None, "meshsim's reader (this torch has no torch.distributed.flight_recorder)"
    return read_dump, "torch.distributed.flight_recorder.components.loader.read_dump"
