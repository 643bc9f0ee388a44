"""One-file persistence of a `StaticIndex`: an uncompressed `.npz`.

The file holds the arrays plus one JSON document (format version, layout,
summary statistics, SHA-256 of layout and arrays). Loading never unpickles
(`allow_pickle=False`), checks the format version, every array's shape and
dtype against the layout, and the checksum. Saving writes a temporary file
next to the target and renames it, so a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile

import numpy as np

from static_keras.index.layout import IndexLayout

FORMAT_NAME = "static-keras-index"
FORMAT_VERSION = 1
_METADATA_KEY = "__metadata__"


def checksum(layout: IndexLayout, arrays: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps(layout.to_config(), sort_keys=True).encode())
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}:{array.dtype.str}:{array.shape};".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


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
    path = os.fspath(path)
    document = json.dumps(metadata(layout, arrays), sort_keys=True)
    payload = dict(arrays)
    payload[_METADATA_KEY] = np.frombuffer(document.encode(), dtype=np.uint8)
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=".tmp-index-", dir=directory)
    try:
        with os.fdopen(handle, "wb") as file:
            np.savez(file, **payload)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o644)  # mkstemp creates 0600; an index is shared
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def load(path) -> tuple[IndexLayout, dict[str, np.ndarray]]:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No index file at {path!r}")
    try:
        # Open the file here so it is closed even when NumPy rejects it.
        with open(path, "rb") as file, np.load(file, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
        raw = arrays.pop(_METADATA_KEY, None)
        document = None if raw is None else json.loads(raw.tobytes().decode())
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, TypeError, AttributeError) as error:
        # TypeError/AttributeError: a plain .npy, which is not an archive.
        # ValueError covers NumPy's header errors and corrupt JSON/UTF-8.
        raise ValueError(
            f"{path!r} is truncated or corrupt and cannot be read as an index "
            f"({type(error).__name__}: {error})"
        ) from None
    if not isinstance(document, dict):
        raise ValueError(f"{path!r} is not a static-keras index (no metadata)")

    if document.get("format") != FORMAT_NAME:
        raise ValueError(f"{path!r} is not a static-keras index file")
    version = document.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{path!r} has index format version {version}; this static-keras "
            f"reads version {FORMAT_VERSION}. Rebuild the index with this version"
        )
    try:
        layout = IndexLayout.from_config(document["layout"])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(
            f"{path!r} has an invalid index layout in its metadata ({error})"
        ) from None
    expected = layout.array_shapes()
    if set(arrays) != set(expected):
        raise ValueError(
            f"{path!r} holds arrays {sorted(arrays)}; its layout needs {sorted(expected)}"
        )
    for name, (shape, dtype) in expected.items():
        if arrays[name].shape != shape or arrays[name].dtype != dtype:
            raise ValueError(
                f"{path!r}: array {name!r} has shape {arrays[name].shape} and "
                f"dtype {arrays[name].dtype}, expected {shape} and {dtype}"
            )
    if checksum(layout, arrays) != document.get("checksum"):
        raise ValueError(f"{path!r} failed its checksum: the file is corrupt")
    return layout, arrays
