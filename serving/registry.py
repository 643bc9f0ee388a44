"""`ConstraintIndexRegistry`: the live index and its eligibility sets, for Python serving.

The STATIC write-up's serving pattern: the index (the trie) changes by the
day, the business rules over it ("in stock", "allowed in FR") by the
minute. A Python server keeps one in-process holder of both; every request
takes one `snapshot()` (an immutable `(version, index, eligibility)`) and
decodes with it from its first step to its last, so a refresh halfway
through a request never mixes two versions of the arrays.

Writes build the new `EligibilitySets` off to the side (`replace` returns a
new object; the old one never changes), then swap one reference, which is
atomic: a reader sees the old snapshot or the new one, never a mix. Writers
are serialised by a lock (two refreshes of different sets both land);
readers take no lock.

NumPy only (no Keras, no TensorFlow): importable as
`static_keras.serving.registry` in a serving process that runs the model
elsewhere.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Mapping

import numpy as np

from static_keras.index.automaton import TokenAutomaton
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.member_catalogue import MemberCatalogue

__all__ = ["ConstraintIndexRegistry", "IndexNotReadyError", "IndexSnapshot", "UnknownSetError"]


class IndexNotReadyError(RuntimeError):
    """A read before the registry's first `load`."""


class UnknownSetError(KeyError, ValueError):
    """A set name the snapshot does not hold (a `KeyError`, and a `ValueError`
    as `EligibilitySets.set_id` raises); the message names the known sets."""

    def __str__(self) -> str:  # KeyError would quote the message; this one is a sentence
        return str(self.args[0]) if self.args else ""


@dataclasses.dataclass(frozen=True)
class IndexSnapshot:
    """One published `(version, index, eligibility)`: what a request decodes with.

    Immutable (the index and the sets are read-only objects too): hold it for
    the whole request, resolve set ids with its `set_id`, and the arrays
    cannot change under you, whatever the registry publishes meanwhile.

    Attributes:
        version: int. Increases with every publication of the registry.
        index: `TokenAutomaton` (`StaticIndex` or `StringIndex`).
        eligibility: `EligibilitySets` over the index's members, or None.
        published_at: float. `time.time()` of the publication.
    """

    version: int
    index: TokenAutomaton
    eligibility: EligibilitySets | None
    published_at: float

    @property
    def set_names(self) -> tuple[str, ...]:
        """The names of the eligibility sets (empty without sets)."""
        return () if self.eligibility is None else self.eligibility.names

    def set_id(self, name: str) -> int:
        """The row of set `name`: what a request passes as its set id."""
        if self.eligibility is None or name not in self.eligibility.names:
            raise UnknownSetError(_unknown_set(name, self.set_names))
        return self.eligibility.set_id(name)

    def eligible_item_ids(self) -> dict[str, np.ndarray]:
        """`{name: sorted int64 item ids}` of every set: what carries a set
        over to a rebuilt index (`replace_index(new, snapshot.eligible_item_ids())`)."""
        if self.eligibility is None:
            return {}
        members = np.arange(self.eligibility.num_members)
        ids = self.eligibility.catalogue.item_ids
        out = {}
        for row, name in enumerate(self.eligibility.names):
            out[name] = np.sort(np.asarray(ids)[members[self.eligibility.contains(row, members)]])
        return out

    def logits_processor(self):
        """A `StringLogitsProcessor` over this snapshot's string index and
        sets (cheap: make one per request)."""
        from static_keras.strings.logits_processor import StringLogitsProcessor
        from static_keras.strings.string_index import StringIndex

        if not isinstance(self.index, StringIndex):
            raise ValueError(
                "`logits_processor()` needs a StringIndex; this snapshot holds a "
                f"{type(self.index).__name__}"
            )
        return StringLogitsProcessor(self.index, eligibility=self.eligibility)


def _unknown_set(name, names) -> str:
    if not names:
        return (
            f"No eligibility set {name!r}: the registry holds no sets; publish some with "
            "load(index, eligibility={name: item_ids})"
        )
    return (
        f"No eligibility set {name!r}; known sets: {list(names)} (add a set with "
        "load(...) or replace_index(index, eligibility))"
    )


class ConstraintIndexRegistry:
    """In-process holder of the live index and its eligibility sets.

    Every publication (`load`, `replace_index`, `refresh_eligibility`,
    `refresh_sets`) makes a new `IndexSnapshot` with a larger version and
    swaps it in with one reference assignment; `snapshot()` returns the
    current one. Readers never lock and never see a mix of two versions;
    writers are serialised. Before the first `load`, every read raises
    `IndexNotReadyError`.

    Example:

    >>> from static_keras.index import StaticIndex
    >>> index = StaticIndex.build(
    ...     [[0, 1], [0, 2], [1, 0]], vocab_size=3, item_ids=[10, 11, 12])
    >>> registry = ConstraintIndexRegistry()
    >>> registry.load(index, {"in_stock": [10, 11, 12]}).version
    1
    >>> before = registry.snapshot()  # a request in flight holds this one
    >>> registry.refresh_eligibility("in_stock", [12]).version
    2
    >>> after = registry.snapshot()
    >>> before.eligibility.sizes(), after.eligibility.sizes()
    ({'in_stock': 3}, {'in_stock': 1})
    """

    def __init__(self):
        self._current: IndexSnapshot | None = None
        self._write_lock = threading.Lock()
        self._ready = threading.Event()

    # Reads (lock-free) -------------------------------------------------------

    def snapshot(self) -> IndexSnapshot:
        """The current `(version, index, eligibility)`; raises
        `IndexNotReadyError` before the first `load`."""
        current = self._current  # one reference read: atomic
        if current is None:
            raise IndexNotReadyError(
                "ConstraintIndexRegistry has no index yet: call "
                "registry.load(index, eligibility) before serving requests"
            )
        return current

    def wait_until_ready(self, timeout: float | None = None) -> IndexSnapshot:
        """Blocks until the first `load` (at most `timeout` seconds), then
        returns the current snapshot; `IndexNotReadyError` on timeout."""
        if not self._ready.wait(timeout):
            raise IndexNotReadyError(
                f"ConstraintIndexRegistry got no index within {timeout} s: call "
                "registry.load(index, eligibility)"
            )
        return self.snapshot()

    @property
    def ready(self) -> bool:
        """Whether an index has been loaded (reads will not raise)."""
        return self._current is not None

    @property
    def version(self) -> int:
        return self.snapshot().version

    @property
    def index(self) -> TokenAutomaton:
        return self.snapshot().index

    @property
    def eligibility(self) -> EligibilitySets | None:
        return self.snapshot().eligibility

    def set_id(self, name: str) -> int:
        """The row of set `name` in the current snapshot. Resolve it from the
        snapshot you decode with (`snapshot().set_id`) when a `load` may
        reorder the sets in between."""
        return self.snapshot().set_id(name)

    def __repr__(self) -> str:
        current = self._current
        if current is None:
            return "ConstraintIndexRegistry(not ready)"
        return (
            f"ConstraintIndexRegistry(version={current.version}, "
            f"index={type(current.index).__name__}(num_members={current.index.num_members}), "
            f"sets={list(current.set_names)})"
        )

    # Writes (serialised) -----------------------------------------------------

    def load(self, index: TokenAutomaton, eligibility=None, *, version: int | None = None):
        """Publishes `index` with `eligibility`; the first call makes the
        registry ready, later ones replace everything.

        Args:
            index: `TokenAutomaton` (`StaticIndex`, `StringIndex`).
            eligibility: `EligibilitySets` built over `index` (same member ->
                item id map), a mapping `{name: item ids}` (built here), or
                None (no sets). Defaults to None.
            version: int or None. The new version; must exceed the current
                one. Defaults to the current version plus one (1 first).

        Returns:
            The published `IndexSnapshot`.
        """
        if not isinstance(index, TokenAutomaton):
            raise ValueError(
                "`index` must be a TokenAutomaton (StaticIndex, StringIndex). "
                f"Received: {type(index).__name__}"
            )
        sets = _sets_for(index, eligibility)
        with self._write_lock:
            return self._publish(index, sets, version)

    def replace_index(self, index: TokenAutomaton, eligibility, *, version: int | None = None):
        """Swaps in a rebuilt index with its sets (the daily refresh).

        The old sets are over the old index's member numbers, so the new sets
        are given explicitly: `EligibilitySets` over `index`, `{name: item
        ids}`, or None. To keep the current rules, pass
        `registry.snapshot().eligible_item_ids()` (valid when item ids are
        stable catalogue ids; a `StringIndex`'s item ids are positions in
        its string list). Raises `IndexNotReadyError` before the first
        `load`. Returns the published `IndexSnapshot`.
        """
        self.snapshot()
        return self.load(index, eligibility, version=version)

    def refresh_eligibility(self, name: str, item_ids, *, version: int | None = None):
        """Rebuilds set `name` from `item_ids` and publishes it (same index).

        The new `EligibilitySets` is built off to the side (`replace`), then
        one reference swap publishes it. Ids outside the catalogue and
        duplicates are fine. Raises `UnknownSetError` (a `KeyError`) naming
        the known sets when `name` is not one. Returns the `IndexSnapshot`.
        """
        return self.refresh_sets({name: item_ids}, version=version)

    def refresh_sets(self, updates: Mapping[str, object], *, version: int | None = None):
        """Rebuilds several sets from `{name: item ids}` and publishes them
        together in one version (a reader sees all of them or none)."""
        if not isinstance(updates, Mapping) or not updates:
            raise ValueError("`updates` must be a non-empty mapping {set name: item ids}")
        with self._write_lock:
            current = self.snapshot()
            sets = current.eligibility
            for name in updates:
                if name not in current.set_names:
                    raise UnknownSetError(_unknown_set(name, current.set_names))
            for name, item_ids in updates.items():
                sets = sets.replace(name, item_ids)
            return self._publish(current.index, sets, version)

    def _publish(self, index, sets, version) -> IndexSnapshot:
        current = self._current
        previous = 0 if current is None else current.version
        if version is None:
            version = previous + 1
        elif isinstance(version, bool) or not isinstance(version, (int, np.integer)):
            raise ValueError(f"`version` must be an int. Received: {version!r}")
        elif version <= previous:
            raise ValueError(
                f"`version` must exceed the current version {previous}. Received: {version}"
            )
        snapshot = IndexSnapshot(int(version), index, sets, time.time())
        self._current = snapshot  # the swap: one reference assignment
        self._ready.set()
        return snapshot


def _sets_for(index: TokenAutomaton, eligibility) -> EligibilitySets | None:
    if eligibility is None:
        return None
    if isinstance(eligibility, Mapping):
        return EligibilitySets.build(index, eligibility)
    if not isinstance(eligibility, EligibilitySets):
        raise ValueError(
            "`eligibility` must be EligibilitySets, a mapping {name: item ids} or None. "
            f"Received: {type(eligibility).__name__}"
        )
    catalogue = MemberCatalogue.from_index(index)
    if (
        eligibility.num_members != catalogue.num_members
        or eligibility.catalogue.fingerprint != catalogue.fingerprint
    ):
        raise ValueError(
            f"`eligibility` was built over another index ({eligibility.num_members} members, "
            f"this one has {catalogue.num_members}, or its member -> item id map differs): "
            "build it with EligibilitySets.build(index, sets)"
        )
    return eligibility
