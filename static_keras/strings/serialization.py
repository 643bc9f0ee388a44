"""One-file persistence of a `StringIndex`: an uncompressed `.npz`.

Mirrors `static_keras.index.serialization`: the arrays (device arrays plus the
member strings) and one JSON document (format name and version, layout, the
vocabulary's checksum, SHA-256 of layout and arrays). Loading never unpickles
(`allow_pickle=False`), checks the version, every array's shape and dtype and
the checksum. Saving writes a temporary file beside the target and renames
it, so a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile

import numpy as np

from static_keras.strings.layout import StringIndexLayout

FORMAT_NAME = "static-keras-string-index"
FORMAT_VERSION = 1
_METADATA_KEY = "__metadata__"
HOST_ARRAYS = ("string_data", "string_offsets")


def checksum(layout: StringIndexLayout, arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 of the layout and the arrays given (device arrays for a layer)."""
    digest = hashlib.sha256()
    digest.update(json.dumps(layout.to_config(), sort_keys=True).encode())
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}:{array.dtype.str}:{array.shape};".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


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
    path = os.fspath(path)
    document = json.dumps(metadata(layout, arrays, **extra), sort_keys=True)
    payload = dict(arrays)
    payload[_METADATA_KEY] = np.frombuffer(document.encode(), dtype=np.uint8)
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=".tmp-string-index-", dir=directory)
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


def expected_shapes(layout: StringIndexLayout, num_strings: int, num_bytes: int) -> dict:
    shapes = dict(layout.array_shapes())
    shapes["string_data"] = ((num_bytes,), np.dtype(np.uint8))
    shapes["string_offsets"] = ((num_strings + 1,), np.dtype(np.int64))
    return shapes


def load(path) -> tuple[StringIndexLayout, dict[str, np.ndarray], dict]:
    """Returns `(layout, arrays, metadata)`; ValueError on anything wrong."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No string index file at {path!r}")
    try:
        with open(path, "rb") as file, np.load(file, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
        raw = arrays.pop(_METADATA_KEY, None)
        document = None if raw is None else json.loads(raw.tobytes().decode())
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, TypeError, AttributeError) as error:
        raise ValueError(
            f"{path!r} is truncated or corrupt and cannot be read as a string index "
            f"({type(error).__name__}: {error})"
        ) from None
    if not isinstance(document, dict) or document.get("format") != FORMAT_NAME:
        raise ValueError(f"{path!r} is not a static-keras string index file")
    version = document.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{path!r} has string index format version {version}; this static-keras "
            f"reads version {FORMAT_VERSION}. Rebuild the index with this version"
        )
    try:
        layout = StringIndexLayout.from_config(document["layout"])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path!r} has an invalid layout in its metadata ({error})") from None
    offsets = arrays.get("string_offsets")
    data = arrays.get("string_data")
    if offsets is None or data is None or offsets.ndim != 1 or offsets.size < 2:
        raise ValueError(f"{path!r} holds no member strings")
    expected = expected_shapes(layout, offsets.size - 1, data.size)
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
    return layout, arrays, document
