"""The file of `EligibilitySets`: one `.npz`, bound to a catalogue.

Written atomically (write, then rename) so a server never reads half a
file; it records the catalogue's fingerprint, and `read` refuses a file
written for another member -> item id map, a wrong shape or a rank
directory that does not match the bits.
"""

from __future__ import annotations

import os

import numpy as np

from static_keras.index import npz_archive
from static_keras.index.eligibility_bits import directory_size
from static_keras.index.eligibility_bits import rank_directory
from static_keras.index.eligibility_bits import words_per_set

FORMAT_NAME = "static-keras-eligibility"
FORMAT_VERSION = 2  # 2: one directory entry per pair of words (1: per word)


def write(path, names, words, directory, catalogue) -> None:
    """Writes the sets `names` (`words [S, W]`, `directory [S, D]`) over `catalogue`."""
    document = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "names": list(names),
        "num_members": catalogue.num_members,
        "catalogue_fingerprint": catalogue.fingerprint,
    }
    arrays = {"words": words, "directory": directory}
    npz_archive.write(path, arrays, document, temp_prefix=".eligibility-")


def read(path, catalogue) -> tuple[list, np.ndarray, np.ndarray]:
    """`(names, words, directory)` of a file written by `write` for `catalogue`
    (ValueError otherwise, or when the file is corrupt)."""
    arrays, document = npz_archive.read(path, kind="eligibility sets file")
    npz_archive.check_document(
        path, document, name=FORMAT_NAME, version=FORMAT_VERSION, kind="eligibility sets"
    )
    names = document.get("names")
    if not isinstance(names, list) or document.get("num_members") != catalogue.num_members:
        raise ValueError(
            f"{os.fspath(path)!r} holds sets over {document.get('num_members')} members; "
            f"this index has {catalogue.num_members}"
        )
    if document.get("catalogue_fingerprint") != catalogue.fingerprint:
        raise ValueError(
            f"{os.fspath(path)!r} was written for another catalogue (its member -> "
            "item id map differs): rebuild the sets for this index"
        )
    shapes = {
        "words": ((len(names), words_per_set(catalogue.num_members)), np.dtype(np.uint32)),
        "directory": ((len(names), directory_size(catalogue.num_members)), np.dtype(np.uint32)),
    }
    npz_archive.check_arrays(repr(os.fspath(path)), arrays, shapes)
    if not np.array_equal(arrays["directory"], rank_directory(arrays["words"])):
        raise ValueError(f"{os.fspath(path)!r}: the rank directory does not match the bits")
    return names, arrays["words"], arrays["directory"]
