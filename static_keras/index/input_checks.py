"""What an index builder is given, checked: one clear error per mistake.

Sequences (rank 2, integers in `[0, vocab_size)`, not ragged, not empty),
item ids (one non-negative int64 per sequence), the vocabulary size and
the duplicate-item policy; both the in-memory builder (`index/builder.py`)
and the Beam build (`index/beam_build`) call these.
"""

from __future__ import annotations

import numpy as np

from static_keras.index.layout import token_dtype

DUPLICATE_ITEM_POLICIES = ("error", "first", "last")


def check_vocab_size(vocab_size) -> int:
    """`vocab_size` as an int; ValueError unless it is a positive integer."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)):
        raise ValueError(f"`vocab_size` must be an integer. Received: vocab_size={vocab_size!r}")
    vocab_size = int(vocab_size)
    if vocab_size < 1:
        raise ValueError(f"`vocab_size` must be at least 1. Received: vocab_size={vocab_size}")
    return vocab_size


def validate_sequences(sequences, vocab_size, *, first_row: int = 0) -> np.ndarray:
    """Checks `sequences` and returns it as a C-contiguous narrow uint array.

    `first_row` is added to the row numbers in error messages (a block of
    rows read from the middle of a file reports the file's row numbers).
    """
    vocab_size = check_vocab_size(vocab_size)
    try:
        array = np.asarray(sequences)
    except ValueError as error:  # NumPy refuses ragged nested lists.
        raise ValueError(
            f"`sequences` is ragged: every sequence must have the same length ({error})"
        ) from None
    if array.dtype == object:
        raise ValueError(
            "`sequences` is ragged or holds non-numbers: expected an integer "
            "array of shape [num_sequences, length]"
        )
    if array.size == 0:
        raise ValueError(
            "`sequences` is empty: the valid set needs at least one sequence "
            f"of at least one token. Received shape {array.shape}"
        )
    if array.ndim != 2:
        raise ValueError(
            f"`sequences` must have rank 2, [num_sequences, length]. Received shape {array.shape}"
        )
    if array.dtype == bool or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"`sequences` must hold integers. Received dtype {array.dtype}")
    low, high = array.min(), array.max()
    if low < 0:
        where = np.argwhere(array < 0)[0]
        raise ValueError(
            f"`sequences` holds a negative token {int(array[tuple(where)])} (row "
            f"{first_row + where[0]}, position {where[1]}); tokens must lie in [0, {vocab_size})"
        )
    if high >= vocab_size:
        where = np.argwhere(array >= vocab_size)[0]
        raise ValueError(
            f"`sequences` holds token {int(array[tuple(where)])} (row {first_row + where[0]}, "
            f"position {where[1]}), out of range for vocab_size={vocab_size}; its largest "
            f"token is {int(high)}, so vocab_size must be at least {int(high) + 1}"
        )
    return np.ascontiguousarray(array, dtype=token_dtype(vocab_size))


def validate_item_ids(item_ids, num_sequences: int, *, first_row: int = 0) -> np.ndarray:
    """Checks `item_ids` (one per sequence) and returns it as int64.

    `first_row` is added to the row numbers in error messages.
    """
    array = np.asarray(item_ids)
    if array.ndim != 1 or array.shape[0] != num_sequences:
        raise ValueError(
            "`item_ids` must be a vector with one id per sequence: expected "
            f"shape ({num_sequences},), received {array.shape}"
        )
    if array.dtype == bool or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"`item_ids` must hold integers. Received dtype {array.dtype}")
    if array.dtype == np.uint64 and array.size and array.max() > np.iinfo(np.int64).max:
        raise ValueError("`item_ids` holds values that do not fit in int64")
    array = array.astype(np.int64, copy=False)
    if array.size and array.min() < 0:
        row = int(np.argmax(array < 0))
        raise ValueError(
            f"`item_ids` must be non-negative (-1 marks 'no item'). Received "
            f"{int(array[row])} (row {first_row + row})"
        )
    return array


def check_duplicate_policy(on_duplicate_item: str) -> None:
    """ValueError unless `on_duplicate_item` is one of the policies."""
    if on_duplicate_item not in DUPLICATE_ITEM_POLICIES:
        raise ValueError(
            f"`on_duplicate_item` must be one of {DUPLICATE_ITEM_POLICIES}. "
            f"Received: on_duplicate_item={on_duplicate_item!r}"
        )
