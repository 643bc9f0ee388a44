"""`EligibilityFilter`: the eligibility sets a constraint layer holds.

Either kind of layer holds one (`AutomatonConstraint.eligibility_filter`);
with 0 sets it adds no weight. It owns the sets' words and rank directory
(and any weights a kind derives from the sets, e.g. the dense-step masks of
semantic IDs), checks a request against them (`check`) and keeps the
candidates whose member range holds an eligible, non-excluded member
(`keep`). The weights are the layer's variables, made with its `add_weight`
in a fixed order (files keep their layout); the filter reads and assigns
them. The kind supplies the member ranges of its states.
"""

from __future__ import annotations

import numpy as np

from static_keras.constraint import eligibility_request
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.eligibility import directory_size
from static_keras.index.eligibility import words_per_set
from static_keras.kernels import eligibility_kernels

SET_WEIGHTS = ("eligibility_words", "eligibility_directory")


class EligibilityFilter:
    """S named eligibility sets over `num_members` members (see the module doc).

    Args:
        eligibility: `EligibilitySets` or None: the sets (assigned once the
            weights exist).
        num_sets: int >= 0, or 0 to take `eligibility`'s count.
        names: the set names, or None (from `eligibility`, else unnamed).
    """

    def __init__(self, eligibility, num_sets, names):
        if eligibility is not None:
            if not isinstance(eligibility, EligibilitySets):
                raise ValueError(
                    "`eligibility` must be an EligibilitySets. "
                    f"Received: {type(eligibility).__name__}"
                )
            if num_sets not in (0, eligibility.num_sets):
                raise ValueError(
                    f"`eligibility_sets`={num_sets} but `eligibility` holds "
                    f"{eligibility.num_sets} sets"
                )
            num_sets = eligibility.num_sets
            names = eligibility.names if names is None else names
        if isinstance(num_sets, bool) or not isinstance(num_sets, (int, np.integer)):
            raise ValueError(f"`eligibility_sets` must be an int >= 0. Received: {num_sets!r}")
        if num_sets < 0:
            raise ValueError(f"`eligibility_sets` must be an int >= 0. Received: {num_sets!r}")
        if names is not None:
            names = tuple(names)
            if len(names) != num_sets:
                raise ValueError(
                    f"`eligibility_names` must name all {num_sets} sets. Received: {list(names)}"
                )
        self.num_sets = int(num_sets)
        self.names = names
        self.pending = eligibility
        self.weights = {}

    def add_weights(self, add_weight, num_members: int, derived_shapes) -> dict:
        """Makes the set weights, then those a kind derives from the sets
        (`derived_shapes`: name -> shape); returns them by name."""
        if not self.num_sets:
            return {}
        shapes = {
            "eligibility_words": (self.num_sets, words_per_set(num_members)),
            "eligibility_directory": (self.num_sets, directory_size(num_members)),
            **derived_shapes,
        }
        for name, shape in shapes.items():
            self.weights[name] = add_weight(
                name=name, shape=shape, dtype="int32", initializer="zeros", trainable=False
            )
        return dict(self.weights)

    def assign(self, sets: EligibilitySets, num_members: int, fingerprint: str, derived) -> None:
        """Assigns `sets` in place (a refresh: no rebuild, no retrace): over
        this index's members (`fingerprint` of its catalogue), as many as
        held, with the same names (a set id keeps its meaning); `derived`:
        `sets -> {name: array}` of the weights a kind derives from them."""
        if not isinstance(sets, EligibilitySets):
            raise ValueError(
                f"`eligibility_sets` must be an EligibilitySets. Received: {type(sets).__name__}"
            )
        if not self.num_sets:
            raise ValueError(
                "This layer holds no eligibility sets; build it with `eligibility=` "
                "or `eligibility_sets=S`"
            )
        if sets.num_members != num_members:
            raise ValueError(
                f"The sets are over {sets.num_members} members; this index has {num_members}"
            )
        if sets.num_sets != self.num_sets:
            raise ValueError(
                f"This layer holds {self.num_sets} eligibility sets. Received {sets.num_sets}"
            )
        sets.require_catalogue(fingerprint, "this layer's index")
        names = tuple(sets.names)
        if self.names is not None and names != tuple(self.names):
            raise ValueError(
                f"The set names differ: the layer has {list(self.names)}, "
                f"the sets have {list(names)} (set ids would change meaning)"
            )
        arrays = sets.device_arrays()
        arrays.update(derived(sets))
        for name, array in arrays.items():
            self.weights[name].assign(array)
        self.names = names

    def held_sets(self, to_numpy, catalogue) -> EligibilitySets:
        """The sets held, as a host `EligibilitySets` (a copy)."""
        if not self.num_sets:
            raise ValueError("This layer holds no eligibility sets")
        words, directory = (
            np.asarray(to_numpy(self.weights[name])).astype(np.int32, copy=False).view(np.uint32)
            for name in SET_WEIGHTS
        )
        names = self.names
        if names is None:
            names = [f"set_{i}" for i in range(self.num_sets)]
        return EligibilitySets(names, words, directory, catalogue)

    def check(self, eligibility, num_members: int, extend=None, rows=None):
        """A request (`Eligibility`) checked and set out for the steps of a
        decode (`eligibility_request.prepare`; `extend`: the kind's)."""
        if not self.num_sets:
            raise ValueError(
                "`eligibility` needs a layer with eligibility sets: build it with "
                "`eligibility=` (an EligibilitySets) or `eligibility_sets=S`"
            )
        return eligibility_request.prepare(
            self.weights["eligibility_words"],
            num_members,
            eligibility,
            self.num_sets,
            extend,
            rows,
        )

    def refresh_spec(self, dense_eligibility) -> dict:
        """What an eligibility-only refresh of an exported model rewrites.

        `{"rewrites": {role: variable}, "reads": {role: variable}, "derive":
        dict or None}`: the variables holding the sets (roles
        `eligibility_words`, `eligibility_directory`), any variables derived
        from them (`dense_eligibility`, the kind's part, or None) with what
        they are derived from (`reads`) and how (`derive`: the settings of
        the host builder). The roles are the names an exported model's
        metadata records (`export.eligibility`).
        """
        if not self.num_sets:
            raise ValueError("This layer holds no eligibility sets")
        spec = {"rewrites": {n: self.weights[n] for n in SET_WEIGHTS}, "reads": {}, "derive": None}
        if dense_eligibility is not None:
            dense_eligibility.extend_refresh_spec(spec)
        return spec

    def keep(self, request, lo, hi):
        """bool: whether each member range `[lo, hi)` holds an eligible,
        non-excluded member of its row's request."""
        words, directory = (self.weights[name] for name in SET_WEIGHTS)
        return eligibility_kernels.keep_mask(words, directory, request, lo, hi)
