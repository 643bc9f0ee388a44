"""`EligibilitySets`: named member bit vectors with a rank directory.

Business rules ("in stock", "allowed in FR", "cold-start pool") change by the
minute while the index (the trie) changes by the day. So eligibility lives
beside the index, over its member numbers, and a decoding step asks of each
candidate next state "is any eligible, non-excluded member below it?". The
members below a state are one range `[lo, hi)` (`TokenAutomaton.member_ranges`),
which makes the question a rank difference over a bit vector
(`index/eligibility_bits.py`: 1.5 bits per member, the same fixed-width,
branch-free reads for every row). (For the dense steps of a semantic-ID
index a layer stores a mask row per dense-head state,
`dense_eligibility.dense_eligibility_masks`, at the depths where that costs
at most half a bit per member, and derives the other depths' rows from
these bits at decode time: `layers.derived_dense_masks`.) Per-request
exclusions (items the user has already seen) are a few member numbers per
row (`MemberCatalogue.exclusion_members`); the exact rule is

    enterable = count(set, lo, hi)
                - #{distinct excluded m in [lo, hi) : m eligible in set} > 0

Refreshing one set from a new list of item ids is one vectorised pass (map
ids to members, scatter, pack, popcount, cumulative sum), far cheaper than
rebuilding the index; `replace` returns a new, read-only object, so a reader
never sees a half-updated set. The device side is
`static_keras.kernels.eligibility_kernels` (it takes `device_arrays()`).

NumPy only (no Keras, no TensorFlow).
"""

from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from static_keras.index import eligibility_bits
from static_keras.index import eligibility_file
from static_keras.index.eligibility_bits import directory_size
from static_keras.index.eligibility_bits import words_per_set
from static_keras.index.member_catalogue import MemberCatalogue

__all__ = ["EligibilitySets", "MemberCatalogue", "directory_size", "words_per_set"]


class EligibilitySets:
    """S named eligibility sets over the members of one index (read-only).

    Each set is a bit vector over member numbers plus a rank directory (see
    the module docstring): 1.5 bits per member per set. Build one with
    `EligibilitySets.build(index, {name: item_ids})`; `replace` refreshes one
    set from a new id list and returns a new object (this one never
    changes, so a decoding thread holding it is never torn); the host
    queries (`rank`, `count`, `eligible_in_range`, `enterable`) are the
    oracle of the device kernels in `static_keras.kernels.eligibility_kernels`,
    which read `device_arrays()`.

    Example:

    >>> from static_keras.index import StaticIndex
    >>> index = StaticIndex.build(
    ...     [[0, 1], [0, 2], [1, 0]], vocab_size=3, item_ids=[10, 11, 12])
    >>> sets = EligibilitySets.build(index, {"in_stock": [11, 12, 99]})
    >>> lo, hi = index.member_ranges(index.walk([[0], [1]]))
    >>> sets.count(sets.set_id("in_stock"), lo, hi).tolist()
    [1, 1]
    >>> sets.replace("in_stock", [10]).count(0, lo, hi).tolist()
    [1, 0]
    """

    def __init__(self, names, words, directory, catalogue: MemberCatalogue):
        names = tuple(names)
        if not names:
            raise ValueError("EligibilitySets needs at least one set")
        for name in names:
            if not isinstance(name, str) or not name:
                raise ValueError(f"Set names must be non-empty strings. Received: {name!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"Set names must be distinct. Received: {list(names)}")
        shapes = {
            "words": (len(names), words_per_set(catalogue.num_members)),
            "directory": (len(names), directory_size(catalogue.num_members)),
        }
        for label, array in (("words", words), ("directory", directory)):
            shape = shapes[label]
            if array.shape != shape or array.dtype != np.uint32:
                raise ValueError(
                    f"`{label}` must be uint32 {shape}. Received {array.dtype} {array.shape}"
                )
        self._names = names
        self._words = words
        self._directory = directory
        for array in (self._words, self._directory):
            array.flags.writeable = False
        self.catalogue = catalogue

    @classmethod
    def build(cls, index_or_catalogue, sets: Mapping[str, object]) -> "EligibilitySets":
        """Sets from `{name: eligible item ids}` (duplicates and ids outside
        the catalogue are fine), over a `TokenAutomaton` or `MemberCatalogue`."""
        catalogue = _catalogue(index_or_catalogue)
        if not isinstance(sets, Mapping) or not sets:
            raise ValueError("`sets` must be a non-empty mapping {name: item ids}")
        members = [catalogue._members_or_absent(ids) for ids in sets.values()]
        words, directory = eligibility_bits.pack_sets(members, catalogue.num_members)
        return cls(list(sets), words, directory, catalogue)

    # Properties --------------------------------------------------------------

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    @property
    def num_sets(self) -> int:
        return len(self._names)

    @property
    def num_members(self) -> int:
        return self.catalogue.num_members

    @property
    def words(self) -> np.ndarray:
        """uint32 `[S, W]` (read-only): bit `m & 31` of word `m >> 5` is member m."""
        return self._words

    @property
    def directory(self) -> np.ndarray:
        """uint32 `[S, D]` (read-only): eligible members before each pair of words."""
        return self._directory

    @property
    def nbytes(self) -> int:
        """Bytes of the sets (words plus directory): what goes to the device."""
        return self._words.nbytes + self._directory.nbytes

    @property
    def bits_per_member(self) -> float:
        """Bits per member per set (1.5, plus a word of room per set)."""
        return 8 * self.nbytes / (self.num_sets * max(self.num_members, 1))

    def set_id(self, name: str) -> int:
        """The row of set `name` (what a request passes to the device)."""
        try:
            return self._names.index(name)
        except ValueError:
            raise ValueError(f"No eligibility set {name!r}; sets: {list(self._names)}") from None

    def sizes(self) -> dict[str, int]:
        """Eligible members per set."""
        totals = np.bitwise_count(self._words).sum(axis=1, dtype=np.int64)
        return dict(zip(self._names, totals.tolist()))

    def device_arrays(self) -> dict[str, np.ndarray]:
        """int32 words `[S, W]` (the same bits) and directory `[S, D]`, for keras.ops."""
        return {
            "eligibility_words": self._words.view(np.int32),
            "eligibility_directory": self._directory.view(np.int32),
        }

    def __repr__(self) -> str:
        return (
            f"EligibilitySets(names={list(self._names)}, num_members={self.num_members}, "
            f"nbytes={self.nbytes})"
        )

    # Refresh -----------------------------------------------------------------

    def replace(self, name: str, item_ids) -> "EligibilitySets":
        """A new object with set `name` rebuilt from `item_ids`; this one is
        unchanged. One vectorised pass over the ids and the set's words."""
        row = self.set_id(name)
        members = self.catalogue._members_or_absent(item_ids)
        words, directory = eligibility_bits.pack(members, self.num_members)
        new_words = self._words.copy()
        new_directory = self._directory.copy()
        new_words[row] = words
        new_directory[row] = directory
        return type(self)(self._names, new_words, new_directory, self.catalogue)

    def carried_over(self, index_or_catalogue) -> "EligibilitySets":
        """The same sets over another index (a new catalogue), by item id.

        A member of the new index is eligible in a set when its item id was
        eligible here; items that are no longer in the catalogue drop out of
        every set, and new items are in none (`sizes()` before and after
        tells how many). Both indexes need real item ids: member numbers
        alone are positions, which a new catalogue reassigns (ValueError
        naming what to pass instead). Over the same catalogue the sets are
        returned as they are.

        Example:

        >>> from static_keras.index import StaticIndex
        >>> old = StaticIndex.build([[0, 1], [1, 0]], vocab_size=2, item_ids=[7, 8])
        >>> sets = EligibilitySets.build(old, {"in_stock": [7, 8]})
        >>> new = StaticIndex.build([[0, 0], [1, 1]], vocab_size=2, item_ids=[8, 9])
        >>> sets.carried_over(new).sizes()
        {'in_stock': 1}
        """
        catalogue = _catalogue(index_or_catalogue)
        if catalogue.fingerprint == self.catalogue.fingerprint:
            return self
        if not (self.catalogue.has_item_ids and catalogue.has_item_ids):
            raise ValueError(
                "Cannot carry eligibility sets over to a new index by item id: "
                f"{'the new index' if self.catalogue.has_item_ids else 'the sets'} "
                "has no item ids (member numbers are positions, which a new catalogue "
                "reassigns). Build the sets over the new index instead: "
                "EligibilitySets.build(new_index, {name: item ids})"
            )
        # A chunk of the shared items at a time: the pairs of a whole
        # catalogue are GBs at 10^8 items; the new bits are 1 byte a member.
        rows = np.arange(self.num_sets)[:, None]
        size = eligibility_bits.words_per_set(catalogue.num_members) * 32
        bits = np.zeros((self.num_sets, size), bool)
        for here, there in self.catalogue.shared_member_chunks(catalogue):
            for row, eligible in enumerate(self.contains(rows, here[None, :])):
                bits[row, there[eligible]] = True
        packed = [eligibility_bits.pack_bits(row) for row in bits]
        del bits
        words, directory = (np.stack(part) for part in zip(*packed))
        return type(self)(self._names, words, directory, catalogue)

    def moved(self, here, there, catalogue: MemberCatalogue) -> "EligibilitySets":
        """The same sets over `catalogue`, where member `here[i]` of this
        catalogue is member `there[i]` of the new one (the others are in no
        set): what `carried_over` finds by item id, and what a catalogue
        delta knows from its merge (`apply_delta_with_member_map`)."""
        bits = self.contains(np.arange(self.num_sets)[:, None], np.asarray(here)[None, :])
        members = [np.asarray(there)[row] for row in bits]
        words, directory = eligibility_bits.pack_sets(members, catalogue.num_members)
        return type(self)(self._names, words, directory, catalogue)

    def require_catalogue(self, fingerprint: str, where: str) -> None:
        """ValueError, naming both, unless these sets are over the catalogue
        (member -> item id map) with `fingerprint`: sets over another index
        would restrict requests to other items without a word."""
        if self.catalogue.fingerprint != fingerprint:
            raise ValueError(
                f"The eligibility sets were built over another index than {where}: "
                f"sets over catalogue {self.catalogue.fingerprint[:16]} "
                f"({self.num_members} members), {where} over catalogue {fingerprint[:16]}. "
                "Build them over this index (EligibilitySets.build(index, ...)) or carry "
                "them over by item id (sets.carried_over(index))"
            )

    # Queries (host side, vectorised; the oracle of the device kernels) -------

    def _positions(self, values, name: str, *, upper: int) -> np.ndarray:
        array = np.asarray(values)
        if array.size and (array.dtype == bool or not np.issubdtype(array.dtype, np.integer)):
            raise ValueError(f"`{name}` must hold integers. Received dtype {array.dtype}")
        array = array.astype(np.int64, copy=False)
        if array.size and (array.min() < 0 or array.max() > upper):
            raise ValueError(f"`{name}` must lie in [0, {upper}]")
        return array

    def rank(self, set_ids, positions) -> np.ndarray:
        """int64: eligible members before each position (`[0, num_members]`);
        `set_ids` broadcasts against `positions`."""
        sets = self._positions(set_ids, "set_ids", upper=self.num_sets - 1)
        positions = self._positions(positions, "positions", upper=self.num_members)
        return eligibility_bits.rank(self._words, self._directory, sets, positions)

    def count(self, set_ids, lo, hi) -> np.ndarray:
        """int64: eligible members in `[lo, hi)` (`lo <= hi`), broadcast."""
        return self.rank(set_ids, hi) - self.rank(set_ids, lo)

    def contains(self, set_ids, members) -> np.ndarray:
        """bool: whether each member is eligible (`num_members`, the padding, is not)."""
        sets = self._positions(set_ids, "set_ids", upper=self.num_sets - 1)
        members = self._positions(members, "members", upper=self.num_members)
        return eligibility_bits.contains(self._words, sets, members)

    def eligible_in_range(self, set_ids, lo, hi, excluded_members=None) -> np.ndarray:
        """int64 `[R, ...]`: eligible, non-excluded members in `[lo, hi)`.

        Args:
            set_ids: int `[R]`, the set of each row.
            lo, hi: int `[R, ...]` member ranges (`member_ranges` of the
                candidate states).
            excluded_members: optional int `[R, E]`, sorted distinct member
                numbers per row padded with `num_members`
                (`MemberCatalogue.exclusion_members`).
        """
        sets = np.asarray(set_ids)
        lo, hi = np.asarray(lo), np.asarray(hi)
        rows = sets.reshape((-1,) + (1,) * (lo.ndim - 1))
        total = self.count(rows, lo, hi)
        if excluded_members is None:
            return total
        excluded = np.asarray(excluded_members)
        eligible = self.contains(sets[:, None], excluded)  # [R, E]
        shape = (excluded.shape[0],) + (1,) * (lo.ndim - 1) + (excluded.shape[1],)
        excluded, eligible = excluded.reshape(shape), eligible.reshape(shape)
        inside = (excluded >= lo[..., None]) & (excluded < hi[..., None]) & eligible
        return total - inside.sum(axis=-1)

    def enterable(self, set_ids, lo, hi, excluded_members=None) -> np.ndarray:
        """bool: whether an eligible, non-excluded member lies in `[lo, hi)`."""
        return self.eligible_in_range(set_ids, lo, hi, excluded_members) > 0

    # Persistence -------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Writes one `.npz` atomically (write, then rename), bound to the
        catalogue's fingerprint (`index/eligibility_file.py`)."""
        eligibility_file.write(path, self._names, self._words, self._directory, self.catalogue)

    @classmethod
    def load(cls, path: str | os.PathLike, index_or_catalogue) -> "EligibilitySets":
        """Reads a file written by `save` for the same catalogue (same member
        -> item id map; ValueError otherwise, or when the file is corrupt)."""
        catalogue = _catalogue(index_or_catalogue)
        names, words, directory = eligibility_file.read(path, catalogue)
        return cls(names, words, directory, catalogue)


def _catalogue(index_or_catalogue) -> MemberCatalogue:
    if isinstance(index_or_catalogue, MemberCatalogue):
        return index_or_catalogue
    return MemberCatalogue.from_index(index_or_catalogue)
