"""Which torch is installed, as a release number, and how it stands against the releases meshsim knows.

Read from the installed distribution's files, not from `import torch`, so the pure parts (the model, the
controller's validation) can ask without paying for torch. `2.15.0+cu132` is release (2, 15, 0): a build's local
suffix says nothing about semantics; whether it is a CUDA build is read from torch/version.py.
"""

from __future__ import annotations

import functools
import re

Release = tuple[int, int, int]

# The releases meshsim was run on, oldest first (each: the sweep, the scenarios, launch and replay; the docs'
# "Torch releases" page has the table). A newer one is run with the newest semantics meshsim knows.
KNOWN: tuple[Release, ...] = ((2, 9, 1), (2, 10, 0), (2, 11, 0), (2, 12, 1), (2, 13, 0), (2, 14, 1), (2, 15, 0))
OLDEST, NEWEST = KNOWN[0], KNOWN[-1]


def parse(text: str) -> Release:
    """'2.15.0+cu132' -> (2, 15, 0); '2.16.0a0+git1234' -> (2, 16, 0); '2.9' -> (2, 9, 0)."""
    found = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", text)
    if found is None:
        raise ValueError(f"not a torch release: {text!r}")
    major, minor, patch = found.groups()
    return int(major), int(minor), int(patch or 0)


def text(release: Release) -> str:
    return ".".join(map(str, release))


@functools.lru_cache(maxsize=1)
def installed_text() -> str:
    """torch's version string as installed ('0' when torch is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "0"


def installed() -> Release:
    return parse(installed_text())


@functools.lru_cache(maxsize=1)
def cuda_build() -> bool:
    """Whether the installed torch was built with CUDA (torch/version.py's `cuda`), whether or not a GPU is here:
    such a build refuses a CUDA device with its own words ("Found no NVIDIA driver")."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("torch")
    folder = list(spec.submodule_search_locations or []) if spec else []
    try:
        with open(os.path.join(folder[0], "version.py")) as f:
            found = re.search(r"^cuda(?:: [^=]+)? = (.+)$", f.read(), re.M)
    except (IndexError, OSError):
        return False
    return found is not None and found.group(1).strip() != "None"


def at_least(release: Release | str) -> bool:
    return installed() >= (parse(release) if isinstance(release, str) else release)


def beyond_known() -> str | None:
    """One line for the top of every report when the installed torch is newer than any meshsim was run on."""
    if installed()[:2] <= NEWEST[:2]:
        return None
    return (f"torch {installed_text()} is newer than any release meshsim knows (newest: {text(NEWEST)}): it is "
            f"checked with {text(NEWEST)}'s semantics")
