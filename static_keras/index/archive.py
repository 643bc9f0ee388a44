"""One archive format for every token automaton, and the registry of its kinds.

A file is an uncompressed `.npz` (see `npz_archive`: atomic write, no
pickles, named errors) whose JSON document says which automaton it holds:

    {"format": "static-keras-automaton", "format_version": 2,
     "kind": "semantic_ids" | "strings", "layout": {...}, "checksum": ...}

`load(path)` reads any kind and returns the right host class (looked up by
name in `KINDS`, imported only when a file of that kind is read, so loading
a semantic-ID index never imports the string compiler). Files written by
static-keras 0.1.0 (formats `static-keras-index` and
`static-keras-string-index`, version 1) hold the same arrays and checksum
and load unchanged; any other format or version fails with an error that
names it.

NumPy and the standard library only.
"""

from __future__ import annotations

import importlib
import os

import numpy as np

from static_keras.index import npz_archive

FORMAT_NAME = "static-keras-automaton"
FORMAT_VERSION = 2

#: kind -> "module:Class" of its host-side automaton.
KINDS = {
    "semantic_ids": "static_keras.index.static_index:StaticIndex",
    "strings": "static_keras.strings.string_index:StringIndex",
}

#: The 0.1.0 formats (version 1), one per kind.
LEGACY_FORMATS = {
    "static-keras-index": "semantic_ids",
    "static-keras-string-index": "strings",
}

#: The 0.1.0 name of the member count, still written for readers of served metadata.
_LEGACY_COUNT = {"semantic_ids": "num_sequences"}

#: What a file is called in messages.
_NOUN = "index"


def automaton_class(kind: str):
    """The host class registered for `kind` (imports its module)."""
    if kind not in KINDS:
        raise ValueError(f"Unknown automaton kind {kind!r}; known kinds: {sorted(KINDS)}")
    module, name = KINDS[kind].split(":")
    return getattr(importlib.import_module(module), name)


def checksum(layout, arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 of a layout and arrays (the same digest as 0.1.0 files carry)."""
    return npz_archive.checksum(layout.to_config(), arrays)


def metadata(kind: str, layout, device_arrays: dict[str, np.ndarray], **extra) -> dict:
    """What a reader (or a served model's assets) needs to know of an automaton.

    `checksum` covers the arrays written to a file (`extra["checksum"]` when
    given, host arrays included); `device_checksum` covers what a layer holds.
    """
    device = checksum(layout, device_arrays)
    document = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "layout": layout.to_config(),
        "num_members": layout.num_members,
        "num_states": layout.num_states,
        "nbytes": int(sum(a.nbytes for a in device_arrays.values())),
        "checksum": device,
        "device_checksum": device,
    }
    if kind in _LEGACY_COUNT:
        document[_LEGACY_COUNT[kind]] = getattr(layout, _LEGACY_COUNT[kind])
    document.update(extra)
    return document


def save(path, automaton) -> None:
    """Writes `automaton` (any registered kind) to one file, atomically."""
    arrays = automaton.archive_arrays()
    device = dict(automaton.arrays)
    extra = automaton.archive_extra()
    if set(arrays) != set(device):  # host-only arrays too (a string set's members)
        extra["checksum"] = checksum(automaton.layout, arrays)
    document = metadata(automaton.kind, automaton.layout, device, **extra)
    npz_archive.write(path, arrays, document, temp_prefix=f".tmp-{automaton.kind}-")


def read(path) -> tuple[str, object, dict[str, np.ndarray], dict]:
    """`(kind, layout, arrays, document)` of a file; ValueError on anything wrong."""
    path = os.fspath(path)
    arrays, document = npz_archive.read(path, kind=_NOUN)
    kind = _kind_of(path, document)
    cls = automaton_class(kind)
    try:
        layout = cls.layout_class.from_config(document["layout"])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(
            f"{path!r} has an invalid {kind} layout in its metadata ({error})"
        ) from None
    npz_archive.check_arrays(repr(path), arrays, cls.expected_shapes(layout, arrays))
    if checksum(layout, arrays) != document.get("checksum"):
        raise ValueError(f"{path!r} failed its checksum: the file is corrupt")
    return kind, layout, arrays, document


def load(path, **options):
    """The automaton in `path`, as the host class of its kind (also
    `static_keras.load_index`). `options` go to that class's loader
    (`vocabulary=` for a string index).

    Example:

    >>> import os, tempfile
    >>> from static_keras.index import StaticIndex, archive
    >>> path = os.path.join(tempfile.mkdtemp(), "two.npz")
    >>> StaticIndex.build([[0, 1], [1, 1]], vocab_size=2).save(path)
    >>> type(archive.load(path)).__name__
    'StaticIndex'
    """
    kind, layout, arrays, document = read(path)
    return automaton_class(kind).from_archive(path, layout, arrays, document, **options)


def _kind_of(path: str, document) -> str:
    if not isinstance(document, dict):
        raise ValueError(f"{path!r} is not a static-keras {_NOUN} (no metadata)")
    name = document.get("format")
    if name in LEGACY_FORMATS:
        npz_archive.check_document(path, document, name=name, version=1, kind=_NOUN)
        return LEGACY_FORMATS[name]
    if name != FORMAT_NAME:
        raise ValueError(
            f"{path!r} is not a static-keras {_NOUN} file (format {name!r}; this "
            f"static-keras reads {FORMAT_NAME!r} and the 0.1.0 formats "
            f"{sorted(LEGACY_FORMATS)})"
        )
    npz_archive.check_document(path, document, name=name, version=FORMAT_VERSION, kind=_NOUN)
    kind = document.get("kind")
    if kind not in KINDS:
        raise ValueError(
            f"{path!r} holds an automaton of kind {kind!r}, which this static-keras does "
            f"not know (known kinds: {sorted(KINDS)})"
        )
    return kind
