"""One automaton contract: both kinds, host and layer, any step, any decode loop.

Oracles: the host-side NumPy automaton (`walk`, `edges`, `next_states`),
checked itself against plain token-by-token walks; the layer is checked
against the host at every reachable state, with a Python int step (the
fast path) and with a tensor step or None (any decode loop), and a greedy
decode inside `ops.while_loop` (TF graph, TF XLA, JAX jit) against a NumPy
greedy decode over the host index.
"""

import textwrap

import keras
import numpy as np
import pytest
from backend_subprocess import run_under
from keras import ops

from static_keras import MASKED_LOGIT
from static_keras import AutomatonConstraint
from static_keras import ConstrainedDecoding
from static_keras import StaticIndex
from static_keras import TokenAutomaton
from static_keras import constraint_for
from static_keras import load_index
from static_keras.strings import StringIndex
from static_keras.strings import TokenVocabulary
from static_keras.strings.string_constrained_decoding import StringConstrainedDecoding

TOKENS = [b"a", b"b", b"c", b"ab", b"bc", b"ca", b"abc", b" ", b"<eos>"]
WORDS = ["abc", "ab", "b", "cab", "a b", "bca", "ccc", "abcabc"]


def semantic_index(dense_levels, seed=0, n=40, vocab=6, length=4):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, vocab, size=(n, length))
    return StaticIndex.build(
        rows, vocab, dense_levels=dense_levels, item_ids=rng.permutation(n) + 100,
        on_duplicate_item="first",
    )  # fmt: skip


def string_index():
    vocab = TokenVocabulary.from_token_bytes(TOKENS, special=[len(TOKENS) - 1])
    return StringIndex.from_strings(WORDS, vocab, eos_token_id=len(TOKENS) - 1)


KINDS = [pytest.param(lambda d=d: semantic_index(d), id=f"semantic-d{d}") for d in range(5)]
KINDS.append(pytest.param(string_index, id="strings"))


def reachable(index: TokenAutomaton) -> list[np.ndarray]:
    """States reachable after exactly t tokens, t = 0 .. length - 1 (host BFS)."""
    frontier, levels = np.zeros(1, np.int64), []
    for _ in range(index.length):
        levels.append(np.unique(frontier))
        _, _, targets = index.edges(levels[-1])
        frontier = targets
    return levels


@pytest.mark.parametrize("make", KINDS)
def test_host_contract_is_consistent(make):
    index = make()
    assert isinstance(index, TokenAutomaton)
    for t, states in enumerate(reachable(index)):
        row, tokens, targets = index.edges(states)
        # Sorted by (row, token); next_states agrees with edges.
        assert np.all(np.diff(row * index.vocab_size + tokens) > 0)
        np.testing.assert_array_equal(index.next_states(states[row], tokens), targets)
        allowed = index.allowed_tokens(states)
        assert allowed.sum() == row.size and allowed[row, tokens].all()
        assert index.step_widths[t] >= np.bincount(row, minlength=states.size).max()
        # A token that is not allowed leads nowhere.
        blocked = np.argmin(allowed, axis=1)
        free = ~allowed[np.arange(states.size), blocked]
        assert np.all(index.next_states(states[free], blocked[free]) == -1)
    assert not index.allowed_tokens(np.array([-1, index.layout.state_space])).any()


@pytest.mark.parametrize("d", range(5))
def test_semantic_walk_numbers_states_globally(d):
    index = semantic_index(d)
    rows = index.sequences()
    for t in range(index.length + 1):
        states = index.walk(rows[:, :t])
        assert np.all(index.depth(states) == t)
        if t < index.length:
            np.testing.assert_array_equal(
                index.next_states(states, rows[:, t]), index.walk(rows[:, : t + 1])
            )
    leaves = index.walk(rows)
    assert index.is_finished(leaves).all()
    np.testing.assert_array_equal(index.item_ids(leaves), index.lookup_item_ids(rows))
    assert not index.is_finished(index.walk(rows[:, :-1])).any()


def _same_candidates(a, b):
    """Equal sets of (token, next state, score) per row, padding ignored."""
    for row in range(a[0].shape[0]):
        found = []
        for scores, tokens, nxt in (a, b):
            keep = tokens[row] >= 0
            found.append(sorted(zip(tokens[row][keep], nxt[row][keep], scores[row][keep])))
        assert found[0] == found[1], row


@pytest.mark.parametrize("make", KINDS)
@pytest.mark.parametrize("top_k", [None, 2])
def test_layer_any_step_equals_int_step_and_host(make, top_k):
    index = make()
    layer = constraint_for(index)
    assert isinstance(layer, AutomatonConstraint)
    rng = np.random.default_rng(1)
    for t, states in enumerate(reachable(index)):
        states = np.concatenate([states, [-1]]).astype(np.int32)
        logits = rng.normal(size=(states.size, index.vocab_size)).astype("float32")
        fixed = [np.asarray(x) for x in layer(logits, states, step=t, dense_top_k=top_k)]
        for step in (None, ops.convert_to_tensor(t, "int32")):
            anywhere = [np.asarray(x) for x in layer(logits, states, step=step, dense_top_k=top_k)]
            assert anywhere[0].shape[1] == layer.num_candidates(None, top_k)
            _same_candidates(fixed, anywhere)
            mask = np.asarray(layer(logits, states, step=step, mode="mask"))
            np.testing.assert_array_equal(mask > MASKED_LOGIT, index.allowed_tokens(states))
        if top_k is None:  # every allowed token is a candidate
            want = index.allowed_tokens(states)
            got = np.zeros_like(want)
            rows, cols = np.nonzero(fixed[1] >= 0)
            got[rows, fixed[1][rows, cols]] = True
            np.testing.assert_array_equal(got, want)
        # advance, every step form, against the host.
        row, tokens, targets = index.edges(states[:-1])
        for step in (t, None, ops.convert_to_tensor(t, "int32")):
            moved = np.asarray(layer.advance(states[:-1][row], tokens, step=step))
            np.testing.assert_array_equal(moved, targets)
        finished = np.asarray(layer.is_finished(targets))
        np.testing.assert_array_equal(finished, index.is_finished(targets))
        np.testing.assert_array_equal(np.asarray(layer.item_ids(targets)), index.item_ids(targets))


def _numpy_greedy(index, table, follow):
    """Greedy decode over the host index: logits = table[step] + follow[previous]."""
    batch = table.shape[1]
    states = np.zeros(batch, np.int64)
    previous = np.zeros(batch, np.int64)
    out = np.zeros((batch, index.length), np.int64)
    for step in range(index.length):
        logits = table[step] + follow[previous]
        logits = np.where(index.allowed_tokens(states), logits, -np.inf)
        token = logits.argmax(axis=1)
        states = index.next_states(states, token)
        out[:, step], previous = token, token
    return out, states


def _loop_decode(layer, table, follow):
    """The same greedy decode in `ops.while_loop`, the step a tensor."""
    table = ops.convert_to_tensor(table)
    follow = ops.convert_to_tensor(follow)
    batch, length = ops.shape(table)[1], layer.length

    def body(step, states, previous, out):
        logits = ops.take(table, step, axis=0) + ops.take(follow, previous, axis=0)
        token = ops.cast(ops.argmax(layer(logits, states, step=step, mode="mask"), axis=1), "int32")
        states = layer.advance(states, token, step=step)
        column = ops.equal(ops.arange(length)[None, :], step)
        out = ops.where(column, token[:, None], out)
        return step + 1, states, token, out

    start = (
        ops.convert_to_tensor(0, "int32"),
        ops.zeros((batch,), "int32"),
        ops.zeros((batch,), "int32"),
        ops.zeros((batch, length), "int32"),
    )
    _, states, _, out = ops.while_loop(lambda step, *_: step < length, body, start)
    return out, states


def _tables(index, batch=5, seed=2):
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(index.length, batch, index.vocab_size)).astype("float32")
    follow = rng.normal(size=(index.vocab_size, index.vocab_size)).astype("float32")
    return table, follow


@pytest.mark.parametrize("make", [KINDS[0], KINDS[2], KINDS[-1]])
def test_greedy_in_a_while_loop_equals_numpy(make):
    index = make()
    layer = constraint_for(index)
    table, follow = _tables(index)
    want_tokens, want_states = _numpy_greedy(index, table, follow)
    assert index.is_finished(want_states).all()
    modes = {"eager": lambda t, f: _loop_decode(layer, t, f)}
    if keras.config.backend() == "tensorflow":
        import tensorflow as tf

        modes["tf graph"] = tf.function(lambda t, f: _loop_decode(layer, t, f))
        modes["tf xla"] = tf.function(lambda t, f: _loop_decode(layer, t, f), jit_compile=True)
    for name, run in modes.items():
        tokens, states = (np.asarray(x) for x in run(table, follow))
        np.testing.assert_array_equal(tokens, want_tokens, err_msg=name)
        np.testing.assert_array_equal(states, want_states, err_msg=name)


_JAX_LOOP = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    import jax
    import numpy as np
    import test_automaton_contract as t
    from static_keras import constraint_for
    for make in (lambda: t.semantic_index(2), t.string_index):
        index = make()
        layer = constraint_for(index)
        table, follow = t._tables(index)
        want, _ = t._numpy_greedy(index, table, follow)
        got, _ = jax.jit(lambda a, b: t._loop_decode(layer, a, b))(table, follow)
        np.testing.assert_array_equal(np.asarray(got), want)
    print("jax loop ok")
    """
)


def test_greedy_in_a_jax_jit_while_loop():
    pytest.importorskip("jax", reason="JAX is an optional backend (pip install .[jax])")
    run_under("jax", _JAX_LOOP, "jax loop ok")


def test_bad_steps_and_kinds():
    index = semantic_index(1)
    layer = constraint_for(index)
    logits, states = np.zeros((1, 6), "float32"), np.zeros(1, "int32")
    with pytest.raises(ValueError, match="scalar int tensor or None"):
        layer(logits, states, step=ops.convert_to_tensor([0, 1]))
    with pytest.raises(ValueError, match="scalar int tensor or None"):
        layer(logits, states, step=ops.convert_to_tensor(0.0))
    with pytest.raises(ValueError, match="must lie in"):
        layer(logits, states, step=-1)
    with pytest.raises(ValueError, match="must be a StaticIndex. Received: StringIndex"):
        ConstrainedDecoding(string_index())
    with pytest.raises(ValueError, match="must be a StringIndex. Received: StaticIndex"):
        StringConstrainedDecoding(index)
    with pytest.raises(ValueError, match="TokenAutomaton"):
        constraint_for(np.zeros(3))
    assert constraint_for(layer) is layer


@pytest.mark.parametrize("make", [KINDS[2], KINDS[-1]])
def test_one_archive_format_for_both_kinds(make, tmp_path):
    index = make()
    index.save(tmp_path / "x.npz")
    loaded = load_index(tmp_path / "x.npz")
    assert type(loaded) is type(index)
    assert loaded.checksum == index.checksum
    assert loaded.metadata()["kind"] == index.kind
    assert constraint_for(loaded).index_metadata()["device_checksum"] == index.checksum


def test_string_archive_of_version_0_1_0_loads(tmp_path):
    # 0.1.0 wrote format "static-keras-string-index", version 1, without a kind.
    from static_keras.index import npz_archive

    index = string_index()
    index.save(tmp_path / "new.npz")
    arrays, document = npz_archive.read(tmp_path / "new.npz", kind="index")
    document.update(format="static-keras-string-index", format_version=1)
    document.pop("kind")
    npz_archive.write(tmp_path / "old.npz", arrays, document, temp_prefix=".tmp-")
    old = StringIndex.load(tmp_path / "old.npz")
    assert old.checksum == index.checksum and old.strings == index.strings
    assert old.vocab_checksum == index.vocab_checksum
    document["format_version"] = 2
    npz_archive.write(tmp_path / "bad.npz", arrays, document, temp_prefix=".tmp-")
    with pytest.raises(ValueError, match="format version 2; this static-keras reads version 1"):
        load_index(tmp_path / "bad.npz")


@pytest.mark.parametrize("make", KINDS)
def test_a_layer_built_from_an_index_holds_what_set_index_assigns(make):
    # Built from an index, the weights are created from its arrays (no zeros
    # first); built from a config (a `.keras` file), they start at zeros and
    # `set_index` / `set_eligibility` assign. Both must hold the same values.
    from static_keras.index.eligibility import EligibilitySets
    from static_keras.index.member_catalogue import MemberCatalogue

    index = make()
    ids = MemberCatalogue.from_index(index).item_ids
    sets = EligibilitySets.build(index, {"odd": ids[1::2], "few": ids[:3]})
    layer_class = type(constraint_for(index))
    built = layer_class(index, eligibility=sets)
    loaded = layer_class.from_config(built.get_config())
    assert not np.asarray(ops.convert_to_numpy(loaded.weights[0])).any()  # zeros until assigned
    loaded.set_index(index)
    loaded.set_eligibility(sets)
    assert [w.path for w in built.weights] == [w.path for w in loaded.weights]
    for ours, theirs in zip(built.weights, loaded.weights):
        np.testing.assert_array_equal(ops.convert_to_numpy(ours), ops.convert_to_numpy(theirs))
    assert (
        built.catalogue_fingerprint()
        == loaded.catalogue_fingerprint()
        == sets.catalogue.fingerprint
    )
    assert built.catalogue_fingerprint(index) == sets.catalogue.fingerprint
    other = semantic_index(1, seed=5, n=30) if isinstance(index, StaticIndex) else string_index()
    if other.layout != index.layout:  # an object from another index is refused
        with pytest.raises(ValueError, match="`index` must be the index this layer holds"):
            built.catalogue_fingerprint(other)
