"""One-file persistence of a `StaticIndex`: an uncompressed `.npz`.

The file holds the arrays plus one JSON document (format version, layout,
summary statistics, SHA-256 of layout and arrays). Loading never unpickles
(`allow_pickle=False`), checks the format version, every array's shape and
dtype against the layout, and the checksum. Saving writes a temporary file
next to the target and renames it, so a reader never sees half a file.
"""

from __future__ import annotations

import os

import numpy as np

from static_keras.index import npz_archive
from static_keras.index.layout import IndexLayout

FORMAT_NAME = "static-keras-index"
FORMAT_VERSION = 1


def checksum(layout: IndexLayout, arrays: dict[str, np.ndarray]) -> str:
    return npz_archive.checksum(layout.to_config(), arrays)


def metadata(layout: IndexLayout, arrays: dict[str, np.ndarray]) -> dict:
    """What a reader (or a served model's assets) needs to know of an index."""
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "layout": layout.to_config(),
        "num_sequences": layout.num_sequences,
        "num_states": layout.num_states,
        "nbytes": int(sum(a.nbytes for a in arrays.values())),
        "checksum": checksum(layout, arrays),
    }


def save(path, layout: IndexLayout, arrays: dict[str, np.ndarray]) -> None:
    npz_archive.write(path, arrays, metadata(layout, arrays), temp_prefix=".tmp-index-")


def load(path) -> tuple[IndexLayout, dict[str, np.ndarray]]:
    path = os.fspath(path)
    arrays, document = npz_archive.read(path, kind="index")
    npz_archive.check_document(
        path, document, name=FORMAT_NAME, version=FORMAT_VERSION, kind="index"
    )
    try:
        layout = IndexLayout.from_config(document["layout"])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(
            f"{path!r} has an invalid index layout in its metadata ({error})"
        ) from None
    npz_archive.check_arrays(repr(path), arrays, layout.array_shapes())
    if checksum(layout, arrays) != document.get("checksum"):
        raise ValueError(f"{path!r} failed its checksum: the file is corrupt")
    return layout, arrays
