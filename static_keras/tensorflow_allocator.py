"""TensorFlow's CPU memory given back when a tensor is freed.

The TensorFlow wheel runs oneDNN's CPU allocator, a best-fit-with-coalescing
pool that keeps every freed buffer for reuse and never returns it to the
system. A server that swaps versions therefore keeps the old version's
index resident after unloading it: at 2x10^7 items, 2.06-2.16x the RSS of
one version after a swap, 1.2 GB more (docs/benchmarks.md, "Server memory
and latency during a swap"). `TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1` keeps oneDNN's kernels
and allocates through the system's `malloc`, so an unloaded version's
buffers go back (large ones are `munmap`ed; `serving.servable.release_memory`
trims the rest).

TensorFlow reads the variable when it creates its CPU allocator, at the
first op that allocates: `static-keras` commands set it before they import
TensorFlow. A user's own value wins. A process that has already run
TensorFlow ops keeps the allocator it has.
"""

from __future__ import annotations

import os

SYSTEM_ALLOCATOR = "TF_ONEDNN_USE_SYSTEM_ALLOCATOR"


def return_freed_memory() -> None:
    """Asks TensorFlow to allocate CPU tensors through `malloc` (unless the
    user set `TF_ONEDNN_USE_SYSTEM_ALLOCATOR`); call it before TensorFlow
    runs its first op."""
    os.environ.setdefault(SYSTEM_ALLOCATOR, "1")
