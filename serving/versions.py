"""The versions TF Serving sees under a `model_base_path`: its integer directories.

TF Serving's file-system source polls the base path and treats every
directory whose name is a positive integer as a version; anything else (a
job's staging directory, a rejected version moved out) is invisible to it.
The development server's version manager and every publishing job list
versions the same way, here.
"""

from __future__ import annotations

import os
import re

_VERSION = re.compile(r"^[1-9][0-9]*$")


def list_versions(model_base_path: str | os.PathLike) -> list[int]:
    """Integer version directories, ascending (temporary dirs are ignored)."""
    base = os.fspath(model_base_path)
    if not os.path.isdir(base):
        return []
    return sorted(
        int(name)
        for name in os.listdir(base)
        if _VERSION.match(name) and os.path.isdir(os.path.join(base, name))
    )
