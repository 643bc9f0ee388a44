"""One-file index archives: an uncompressed `.npz` plus one JSON document.

Shared by the index archives of both kinds (`index.archive`: semantic IDs
and string sets, which differ only in their layout and arrays) and by
eligibility sets files (`index.eligibility`):

- `write` writes a temporary file beside the target, fsyncs it and renames
  it, so a reader (a server polling a folder) never sees half a file;
- `read` never unpickles (`allow_pickle=False`), turns every way a file
  can be broken into one `ValueError` that names the file, and reads each
  array into an aligned buffer (`aligned_arrays`: a layer's weights then
  share it, where NumPy's own read would cost a copy of the index);
- `check_document` and `check_arrays` check the format name and version,
  and every array's shape and dtype against what the layout needs;
- `checksum` is the SHA-256 of a layout config and arrays.

NumPy and the standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile

import numpy as np

from static_keras.index import aligned_arrays

_METADATA_KEY = "__metadata__"
#: Bytes per read of an array from an archive.
_READ_BYTES = 1 << 22


def checksum(config: dict, arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 of a layout config and arrays (names, dtypes, shapes, bytes)."""
    digest = hashlib.sha256()
    digest.update(json.dumps(config, sort_keys=True).encode())
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}:{array.dtype.str}:{array.shape};".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


def write(path, arrays: dict[str, np.ndarray], document: dict, *, temp_prefix: str) -> None:
    """Writes `arrays` and `document` to `path` atomically (write, then rename)."""
    path = os.fspath(path)
    payload = dict(arrays)
    text = json.dumps(document, sort_keys=True)
    payload[_METADATA_KEY] = np.frombuffer(text.encode(), dtype=np.uint8)
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=temp_prefix, dir=directory)
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


def read(path, *, kind: str) -> tuple[dict[str, np.ndarray], dict | None]:
    """`(arrays, document)` of an archive; `document` is None when absent.

    `kind` names the file in errors ("index", "string index").
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No {kind} file at {path!r}")
    try:
        # Open the file here so it is closed even when NumPy rejects it.
        with open(path, "rb") as file, np.load(file, allow_pickle=False) as archive:
            arrays = {name: _read_array(archive, name) for name in archive.files}
        raw = arrays.pop(_METADATA_KEY, None)
        document = None if raw is None else json.loads(raw.tobytes().decode())
    except ValueError as error:
        if "Object arrays cannot be loaded" not in str(error):
            raise _corrupt(path, kind, error) from None
        # An object array is a pickle: loading it could run any code.
        raise ValueError(
            f"{path!r} holds pickled Python objects (an object array), which static-keras "
            f"refuses to load because unpickling can run code; a static-keras {kind} file "
            "holds only numeric arrays. Rebuild it with static-keras"
        ) from None
    except (zipfile.BadZipFile, EOFError, OSError, TypeError, AttributeError) as error:
        # TypeError/AttributeError: a plain .npy, which is not an archive.
        raise _corrupt(path, kind, error) from None
    return arrays, document


def _read_array(archive, name: str) -> np.ndarray:
    """Array `name` of an open `.npz` read into an aligned buffer; through
    NumPy's reader (which checks for pickles) where it is not a plain
    C-order numeric array."""
    member = name + ".npy" if name + ".npy" in archive.zip.namelist() else name
    with archive.zip.open(member) as file:
        version = np.lib.format.read_magic(file)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(file)
        elif version == (2, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(file)
        else:
            return archive[name]
        if fortran_order or dtype.hasobject:
            return archive[name]
        array = aligned_arrays.empty(shape, dtype)
        buffer = memoryview(array.reshape(-1).view(np.uint8))
        filled = 0
        while filled < len(buffer):
            # A bounded read: a zip member's `readinto` reads into a
            # temporary bytes object of the size asked for.
            count = file.readinto(buffer[filled : filled + _READ_BYTES])
            if not count:
                raise EOFError(f"array {name!r} ends after {filled} of {len(buffer)} bytes")
            filled += count
    return array


def _corrupt(path: str, kind: str, error: Exception) -> ValueError:
    # ValueError covers NumPy's header errors and corrupt JSON/UTF-8.
    return ValueError(
        f"{path!r} is truncated or corrupt and cannot be read as a static-keras {kind} "
        f"({type(error).__name__}: {error})"
    )


def check_document(path, document, *, name: str, version: int, kind: str) -> None:
    """ValueError unless `document` is a metadata dict of format `name`, `version`."""
    path = os.fspath(path)
    if not isinstance(document, dict):
        raise ValueError(f"{path!r} is not a static-keras {kind} (no metadata)")
    if document.get("format") != name:
        raise ValueError(f"{path!r} is not a static-keras {kind} file")
    found = document.get("format_version")
    if not isinstance(found, int) or isinstance(found, bool):
        raise ValueError(
            f"{path!r}: its {kind} format version is {found!r} ({type(found).__name__}), "
            f"not an integer; this static-keras reads version {version} (the integer). "
            "The metadata was edited or written by another tool: rebuild the file"
        )
    if found != version:
        raise ValueError(
            f"{path!r} has {kind} format version {found}; this static-keras reads "
            f"version {version}. Rebuild the index with this version"
        )


def check_arrays(owner: str, arrays: dict[str, np.ndarray], expected: dict) -> None:
    """ValueError unless `arrays` are exactly `expected` {name: (shape, dtype)}.

    `owner` starts the message: a file's `repr(path)`, or "StaticIndex".
    """
    if set(arrays) != set(expected):
        raise ValueError(
            f"{owner} holds arrays {sorted(arrays)}; its layout needs {sorted(expected)}"
        )
    for name, (shape, dtype) in expected.items():
        if arrays[name].shape != shape or arrays[name].dtype != dtype:
            raise ValueError(
                f"{owner}: array {name!r} has shape {arrays[name].shape} and "
                f"dtype {arrays[name].dtype}, expected {shape} and {dtype}"
            )
