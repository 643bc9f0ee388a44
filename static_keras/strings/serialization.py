"""One-file persistence of a `StringIndex`: an uncompressed `.npz`.

Mirrors `static_keras.index.serialization`: the arrays (device arrays plus the
member strings) and one JSON document (format name and version, layout, the
vocabulary's checksum, SHA-256 of layout and arrays). Loading never unpickles
(`allow_pickle=False`), checks the version, every array's shape and dtype and
the checksum. Saving writes a temporary file beside the target and renames
it, so a reader never sees half a file.
"""

from __future__ import annotations

import os

import numpy as np

from static_keras.index import npz_archive
from static_keras.strings.layout import StringIndexLayout

FORMAT_NAME = "static-keras-string-index"
FORMAT_VERSION = 1
HOST_ARRAYS = ("string_data", "string_offsets")


def checksum(layout: StringIndexLayout, arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 of the layout and the arrays given (device arrays for a layer)."""
    return npz_archive.checksum(layout.to_config(), arrays)


def metadata(layout: StringIndexLayout, arrays: dict[str, np.ndarray], **extra) -> dict:
    """What a reader (or a served model's assets) needs to know of an index."""
    device = {name: a for name, a in arrays.items() if name not in HOST_ARRAYS}
    document = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "layout": layout.to_config(),
        "num_members": layout.num_members,
        "num_states": layout.num_states,
        "nbytes": int(sum(a.nbytes for a in device.values())),
        "checksum": checksum(layout, arrays),
        "device_checksum": checksum(layout, device),
    }
    document.update(extra)
    return document


def save(path, layout: StringIndexLayout, arrays: dict[str, np.ndarray], **extra) -> None:
    document = metadata(layout, arrays, **extra)
    npz_archive.write(path, arrays, document, temp_prefix=".tmp-string-index-")


def expected_shapes(layout: StringIndexLayout, num_strings: int, num_bytes: int) -> dict:
    shapes = dict(layout.array_shapes())
    shapes["string_data"] = ((num_bytes,), np.dtype(np.uint8))
    shapes["string_offsets"] = ((num_strings + 1,), np.dtype(np.int64))
    return shapes


def load(path) -> tuple[StringIndexLayout, dict[str, np.ndarray], dict]:
    """Returns `(layout, arrays, metadata)`; ValueError on anything wrong."""
    path = os.fspath(path)
    arrays, document = npz_archive.read(path, kind="string index")
    npz_archive.check_document(
        path, document, name=FORMAT_NAME, version=FORMAT_VERSION, kind="string index"
    )
    try:
        layout = StringIndexLayout.from_config(document["layout"])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path!r} has an invalid layout in its metadata ({error})") from None
    offsets = arrays.get("string_offsets")
    data = arrays.get("string_data")
    if offsets is None or data is None or offsets.ndim != 1 or offsets.size < 2:
        raise ValueError(f"{path!r} holds no member strings")
    npz_archive.check_arrays(
        repr(path), arrays, expected_shapes(layout, offsets.size - 1, data.size)
    )
    if checksum(layout, arrays) != document.get("checksum"):
        raise ValueError(f"{path!r} failed its checksum: the file is corrupt")
    return layout, arrays, document
