"""DTensor on simulated GPU meshes."""

from __future__ import annotations


def install() -> None:
    pass
