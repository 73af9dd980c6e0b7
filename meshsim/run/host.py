"""The simulated host a rank of `meshsim launch` runs on: its name, its own disk, its threads, torchrun's variables.

On a real cluster the ranks of host h share a hostname that no other host has, a local disk (a checkpoint that
local rank 0 writes to a relative path is missing on every other host), and what torchrun exported for the
attempt. Here every host is a directory on one machine and a name that resolves to loopback.
"""

from __future__ import annotations

import os
from typing import Any

from ..core.wire import ScriptHost

LOOPBACK = "127.0.0.1"


def become(host: ScriptHost) -> None:
    """Make this process a rank of `host` (before the script runs)."""
    for name, value in host.env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    os.chdir(host.cwd)
    if host.tmpdir is not None:
        _own_tmpdir(host.tmpdir)
    _name(host.hostname, host.hostnames)
    if host.threads is not None:
        import torch

        # The ranks were forked from a process that had torch loaded: OMP_NUM_THREADS set now does not reach
        # torch's thread pool, which a fresh `python` under torchrun would have sized from it.
        torch.set_num_threads(host.threads)


def _own_tmpdir(directory: str) -> None:
    import tempfile

    os.environ["TMPDIR"] = directory
    tempfile.tempdir = None  # forget the directory chosen before the rank knew its host (tempfile reads TMPDIR anew)


def _name(hostname: str, hostnames: tuple[str, ...]) -> None:
    """socket.gethostname(), platform.node(), os.uname().nodename, socket.getfqdn() and $HOSTNAME say `hostname`;
    every simulated host's name resolves to loopback."""
    import platform
    import socket

    real = os.uname()
    named = os.uname_result((real.sysname, hostname, real.release, real.version, real.machine))
    os.uname = lambda: named
    os.environ["HOSTNAME"] = hostname
    platform_state: Any = platform
    platform_state._uname_cache = None  # platform.uname() read os.uname() once and kept it
    known = frozenset(hostnames)
    by_name, by_name_ex, addresses, fqdn = (socket.gethostbyname, socket.gethostbyname_ex, socket.getaddrinfo,
                                            socket.getfqdn)

    def gethostbyname(name: str) -> str:
        return LOOPBACK if name in known else by_name(name)

    def gethostbyname_ex(name: str) -> tuple[str, list[str], list[str]]:
        return (name, [], [LOOPBACK]) if name in known else by_name_ex(name)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        return addresses(LOOPBACK if host in known else host, *args, **kwargs)

    def getfqdn(name: str = "") -> str:
        # a lookup of a simulated name would ask DNS, which may take seconds to say it does not know it
        if not name or name == "0.0.0.0":
            return hostname
        return name if name in known else fqdn(name)

    socket_module: Any = socket
    socket_module.gethostname = lambda: hostname
    socket_module.gethostbyname = gethostbyname
    socket_module.gethostbyname_ex = gethostbyname_ex
    socket_module.getaddrinfo = getaddrinfo
    socket_module.getfqdn = getfqdn
