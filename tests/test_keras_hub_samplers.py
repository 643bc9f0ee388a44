"""keras-hub integration: constrained `CausalLM.generate` and the step decoder.

A tiny randomly initialised GPT-2 (no downloads) over a synthetic
vocabulary. Oracles: every answer is a member of the set; greedy decoding
equals a NumPy greedy decode over the model's own full-sequence logits
masked with `index.allowed_tokens`; beam search with at least as many beams
as valid token sequences finds all of them, scored as the oracle scores
every sequence with the same model; `CausalLMDecoder` + `beam_search` agrees.
"""

import subprocess
import sys

import keras
import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub", reason="the integration needs keras-hub")

from static_keras import StaticIndex  # noqa: E402
from static_keras import StringConstrainedDecoding  # noqa: E402
from static_keras import StringIndex  # noqa: E402
from static_keras import TokenVocabulary  # noqa: E402
from static_keras import beam_search  # noqa: E402
from static_keras.keras_hub import CausalLMDecoder  # noqa: E402
from static_keras.keras_hub import ConstrainedBeamSampler  # noqa: E402
from static_keras.keras_hub import ConstrainedSampler  # noqa: E402

TOKENS = [b"a", b"b", b"c", b"ab", b"bc", b"ca", b"abc", b"ba", b"cc", b"x", b"<pad>", b"<eos>"]
V = len(TOKENS)
PAD, EOS = 10, 11
STRINGS = ["abc", "ab", "cab", "bca", "c"]  # 13 tokenizations in all
TOTAL = 10  # positions of token_ids: prompt + answer
SEMANTIC_IDS = np.array([[1, 2, 3], [1, 2, 4], [1, 5, 0], [2, 2, 2], [7, 1, 1], [7, 1, 3]])


@pytest.fixture(scope="module")
def vocab():
    return TokenVocabulary.from_token_bytes(TOKENS, special=[PAD, EOS], eos_token_id=EOS)


@pytest.fixture(scope="module")
def index(vocab):
    return StringIndex.from_strings(STRINGS, vocab)


@pytest.fixture(scope="module")
def semantic_index():
    return StaticIndex.build(SEMANTIC_IDS, vocab_size=V, item_ids=np.arange(6) + 100)


@pytest.fixture(scope="module")
def causal_lm():
    keras.utils.set_random_seed(3)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=V,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=32,
    )
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def prompts(lengths, seed=0):
    """Right-padded `token_ids [B, TOTAL]`, `padding_mask`, and the prompts."""
    rng = np.random.default_rng(seed)
    token_ids = np.full((len(lengths), TOTAL), PAD, "int32")
    rows = [rng.integers(0, PAD, n).astype("int32") for n in lengths]
    for row, prompt in zip(token_ids, rows):
        row[: len(prompt)] = prompt
    padding_mask = np.arange(TOTAL)[None, :] < np.array(lengths)[:, None]
    return token_ids, padding_mask, rows


def generate(causal_lm, sampler, token_ids, padding_mask, stop=(EOS,), jit_compile=False):
    causal_lm.compile(sampler=sampler, jit_compile=jit_compile)
    out = causal_lm.generate(
        {"token_ids": token_ids, "padding_mask": padding_mask},
        stop_token_ids=None if stop is None else list(stop),
    )
    return np.asarray(out["token_ids"]), np.asarray(out["padding_mask"])


def answers(token_ids, padding_mask, end=EOS):
    """Each row's tokens after its prompt, up to and including the end token."""
    result = []
    for row, mask in zip(token_ids, padding_mask):
        answer = row[mask.sum() :].tolist()
        result.append(answer[: answer.index(end) + 1] if end in answer else answer)
    return result


def log_probs(causal_lm, sequences):
    """float64 `[N, TOTAL, V]`: log-softmax of one full, uncached forward pass.

    Sequences are padded to TOTAL positions (the causal mask keeps each
    position independent of later ones; a length-1 attention would warn)."""
    padded = np.full((len(sequences), TOTAL), PAD, "int32")
    for row, sequence in zip(padded, sequences):
        row[: len(sequence)] = sequence
    logits = causal_lm({"token_ids": padded, "padding_mask": np.ones_like(padded, bool)})
    logits = np.asarray(logits, np.float64)
    return logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)


def last_log_probs(causal_lm, sequence):
    """float64 `[V]`: the log-probs of the token after `sequence`."""
    return log_probs(causal_lm, [sequence])[0, len(sequence) - 1]


def scores(causal_lm, prompt, answers):
    """float64 `[N]`: total log-prob of each answer after `prompt` (the oracle)."""
    lp = log_probs(causal_lm, [list(prompt) + list(a) for a in answers])
    n = len(prompt)
    return np.array(
        [sum(lp[r, n + i - 1, t] for i, t in enumerate(a)) for r, a in enumerate(answers)]
    )


def best(causal_lm, prompt, answers):
    """The answer of highest total log-prob."""
    return answers[int(np.argmax(scores(causal_lm, prompt, answers)))]


def string_sequences(index):
    """Every valid token sequence of a string set (all tokenizations), EOS last."""
    done, frontier = [], [([], 0)]
    while frontier:
        tokens, state = frontier.pop()
        for token in np.flatnonzero(index.allowed_tokens([state])[0]):
            nxt = int(index.next_states([state], [token])[0])
            (done if token == index.eos_token_id else frontier).append((tokens + [int(token)], nxt))
    return sorted(tokens for tokens, _ in done)


def reference_greedy_string(causal_lm, index, prompt):
    tokens, state = list(prompt), 0
    for _ in range(index.length):
        logits = last_log_probs(causal_lm, tokens)
        allowed = index.allowed_tokens([state])[0]
        token = int(np.argmax(np.where(allowed, logits, -np.inf)))
        tokens.append(token)
        state = int(index.next_states([state], [token])[0])
        if token == index.eos_token_id:
            break
    return tokens[len(prompt) :]


def reference_greedy_semantic(causal_lm, index, prompt):
    tokens = list(prompt)
    for step in range(index.length):
        logits = last_log_probs(causal_lm, tokens)
        allowed = index.allowed_tokens(np.array([tokens[len(prompt) :]], "int32").reshape(1, step))
        tokens.append(int(np.argmax(np.where(allowed[0], logits, -np.inf))))
    return tokens[len(prompt) :]


# Greedy and sampling -------------------------------------------------------


def test_greedy_string_answers_equal_the_numpy_reference(causal_lm, index):
    token_ids, padding_mask, rows = prompts([3, 3, 3, 3], seed=1)
    out, out_mask = generate(causal_lm, ConstrainedSampler(index), token_ids, padding_mask)
    found = answers(out, padding_mask)
    assert index.lookup_item_ids(found).min() >= 0
    for answer, prompt in zip(found, rows):
        assert answer == reference_greedy_string(causal_lm, index, prompt)
    # keras-hub's own output mask ends right after each row's EOS.
    for mask, answer, n in zip(out_mask, found, [3] * 4):
        assert mask.sum() == n + len(answer)
    np.testing.assert_array_equal(out[:, :3], token_ids[:, :3])  # prompts kept


def test_greedy_prompts_of_different_lengths_in_one_batch(causal_lm, index):
    lengths = [1, 4, 2, 5]
    token_ids, padding_mask, rows = prompts(lengths, seed=2)
    out, _ = generate(causal_lm, ConstrainedSampler(index), token_ids, padding_mask)
    for row, n, prompt, answer in zip(out, lengths, rows, answers(out, padding_mask)):
        np.testing.assert_array_equal(row[:n], prompt)
        assert answer == reference_greedy_string(causal_lm, index, prompt)
        assert index.lookup_item_ids([answer])[0] >= 0


def test_greedy_is_the_same_under_xla(causal_lm, index):
    token_ids, padding_mask, _ = prompts([2, 3, 1], seed=3)
    plain, _ = generate(causal_lm, ConstrainedSampler(index), token_ids, padding_mask)
    xla, _ = generate(
        causal_lm, ConstrainedSampler(index), token_ids, padding_mask, jit_compile=True
    )
    np.testing.assert_array_equal(plain, xla)


def test_top_k_samples_are_members_and_vary(causal_lm, index):
    # k=6 exceeds the allowed tokens of most states: masked tokens sit in the
    # top k with probability 0 and must never be drawn.
    token_ids, padding_mask, _ = prompts([2] * 12, seed=4)
    sampler = ConstrainedSampler(index, k=6, temperature=3.0, seed=7)
    out, _ = generate(causal_lm, sampler, token_ids, padding_mask)
    found = answers(out, padding_mask)
    ids = index.lookup_item_ids(found)
    assert ids.min() >= 0, found
    assert len(set(ids.tolist())) > 1  # sampled, not greedy


def test_without_stop_tokens_the_answer_is_padded_with_eos(causal_lm, index):
    token_ids, padding_mask, _ = prompts([2, 2], seed=5)
    out, out_mask = generate(
        causal_lm, ConstrainedSampler(index), token_ids, padding_mask, stop=None
    )
    assert out_mask.all()  # no stop tokens: generate runs to the end
    for answer, row in zip(answers(out, padding_mask), out):
        assert index.lookup_item_ids([answer])[0] >= 0
        assert (row[2 + len(answer) :] == EOS).all()


@pytest.mark.parametrize("beams", [None, 4])
def test_padding_with_the_stop_token_still_generates(causal_lm, index, beams):
    # keras-hub's own loop would stop at once: the padding ahead holds EOS.
    token_ids, padding_mask, _ = prompts([2, 3], seed=14)
    eos_padded = np.where(padding_mask, token_ids, EOS).astype("int32")
    found = []
    for ids in (token_ids, eos_padded):
        if beams is None:
            sampler = ConstrainedSampler(index)
        else:
            sampler = ConstrainedBeamSampler(index, num_beams=beams)
        out, _ = generate(causal_lm, sampler, ids, padding_mask)
        found.append(answers(out, padding_mask))
    assert found[0] == found[1]
    assert index.lookup_item_ids(found[1]).min() >= 0


def test_sampler_accepts_a_layer_and_round_trips_its_config(index):
    layer = StringConstrainedDecoding(index)
    sampler = ConstrainedSampler(layer, k=3, temperature=0.5, seed=2)
    assert sampler.constraint is layer
    again = ConstrainedSampler(layer, **sampler.get_config())
    assert (
        again.get_config()
        == sampler.get_config()
        == {
            "temperature": 0.5,
            "k": 3,
            "seed": 2,
            "end_token_id": None,
        }
    )
    beam = ConstrainedBeamSampler(index, num_beams=3, return_all_beams=True)
    assert ConstrainedBeamSampler(index, **beam.get_config()).get_config() == beam.get_config()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"constraint": [1, 2]}, "`constraint` must be"),
        ({"k": 0}, "`k` must be a positive integer"),
        ({"k": V + 1}, "`k` must be at most"),
        ({"temperature": 0.0}, "`temperature` must be a positive number"),
        ({"end_token_id": 3}, "`end_token_id` must be None or 11"),
        ({"end_token_id": V}, r"`end_token_id` must be an int in \[0, 12\)"),
    ],
)
def test_sampler_arguments_are_checked(index, kwargs, match):
    kwargs = {"constraint": index, **kwargs}
    with pytest.raises(ValueError, match=match):
        ConstrainedSampler(**kwargs)


def test_beam_sampler_arguments_are_checked(index):
    with pytest.raises(ValueError, match="`num_beams` must be a positive integer"):
        ConstrainedBeamSampler(index, num_beams=0)
    with pytest.raises(ValueError, match="`constraint` must be"):
        ConstrainedBeamSampler("abc", num_beams=2)


# Beam search ---------------------------------------------------------------


def sampler_next(causal_lm, token_ids, padding_mask):
    """keras-hub's `GPT2CausalLM.generate_step` setup, to call a sampler directly."""
    token_ids = keras.ops.convert_to_tensor(token_ids)
    _, cache = causal_lm._build_cache(token_ids)
    index = int(padding_mask.sum(axis=1).min())

    def next(prompt, cache, index):
        logits, hidden, cache = causal_lm.call_with_cache(
            prompt[:, index - 1 : index], cache, index - 1
        )
        return logits[:, 0], hidden[:, 0], cache

    return next, token_ids, cache, index


def test_beam_sampler_finds_every_valid_sequence_with_its_oracle_score(causal_lm, index):
    sequences = string_sequences(index)
    assert len(sequences) == 13
    lengths = [2, 4]
    token_ids, padding_mask, rows = prompts(lengths, seed=6)
    sampler = ConstrainedBeamSampler(index, num_beams=16, return_all_beams=True)
    next, prompt, cache, start = sampler_next(causal_lm, token_ids, padding_mask)
    beams, beam_scores = sampler(
        next, prompt, cache=cache, index=start, mask=padding_mask, stop_token_ids=[EOS]
    )
    beams, beam_scores = np.asarray(beams), np.asarray(beam_scores)
    assert beams.shape == (2, 16, TOTAL) and beam_scores.shape == (2, 16)
    for b, (n, prompt_tokens) in enumerate(zip(lengths, rows)):
        live = np.isfinite(beam_scores[b])
        assert live.sum() == 13 and (beam_scores[b][:-1] >= beam_scores[b][1:]).all()  # best first
        found = answers(beams[b][live], padding_mask[[b] * 13])
        assert sorted(found) == sequences
        expected = scores(causal_lm, prompt_tokens, found)
        np.testing.assert_allclose(beam_scores[b][live], expected, rtol=1e-4)
        np.testing.assert_array_equal(beams[b, :, :n], np.broadcast_to(prompt_tokens, (16, n)))


def test_beam_generate_returns_the_exhaustive_best_member(causal_lm, index):
    sequences = string_sequences(index)
    lengths = [1, 3, 5]
    token_ids, padding_mask, rows = prompts(lengths, seed=7)
    sampler = ConstrainedBeamSampler(index, num_beams=13)
    out, _ = generate(causal_lm, sampler, token_ids, padding_mask)
    for answer, prompt in zip(answers(out, padding_mask), rows):
        oracle = best(causal_lm, prompt, sequences)
        assert answer == oracle


def test_distinct_items_returns_each_member_once_with_its_best_tokenization(causal_lm, index):
    sequences = string_sequences(index)
    lengths = [2, 4]
    token_ids, padding_mask, rows = prompts(lengths, seed=6)
    sampler = ConstrainedBeamSampler(
        index, num_beams=16, return_all_beams=True, distinct_items=True
    )
    next, prompt, cache, start = sampler_next(causal_lm, token_ids, padding_mask)
    beams, beam_scores = sampler(next, prompt, cache, start, padding_mask, [EOS])
    beams, beam_scores = np.asarray(beams), np.asarray(beam_scores)
    for b, prompt_tokens in enumerate(rows):
        # The oracle: every tokenization scored by the model, the best per member.
        every = scores(causal_lm, prompt_tokens, sequences)
        best_of = {}
        for sequence, score in zip(sequences, every):
            member = index.lookup_item_ids([sequence])[0]
            if member not in best_of or score > best_of[member][1]:
                best_of[member] = (sequence, score)
        live = np.isfinite(beam_scores[b])
        assert live.sum() == len(STRINGS)
        found = answers(beams[b][live], padding_mask[[b] * len(STRINGS)])
        expected = sorted(best_of.values(), key=lambda pair: -pair[1])
        assert found == [sequence for sequence, _ in expected]
        np.testing.assert_allclose(beam_scores[b][live], [s for _, s in expected], rtol=1e-4)


def test_an_eligibility_set_and_exclusions_restrict_every_row(causal_lm, vocab):
    from static_keras.index.eligibility import EligibilitySets

    index = StringIndex.from_strings(STRINGS, vocab)
    sets = EligibilitySets.build(index, {"short": [1, 4], "no_c": [0, 1, 3]})
    layer = StringConstrainedDecoding(index, eligibility=sets)
    sequences = string_sequences(index)
    token_ids, padding_mask, rows = prompts([2, 3], seed=10)
    for kwargs, allowed in (
        ({"eligibility_set": "short"}, {1, 4}),
        ({"eligibility_set": 1, "excluded_item_ids": [3]}, {0, 1}),
        ({"excluded_item_ids": [0, 2, 99]}, {1, 3, 4}),
    ):
        sampler = ConstrainedBeamSampler(layer, num_beams=16, return_all_beams=True, **kwargs)
        next, prompt, cache, start = sampler_next(causal_lm, token_ids, padding_mask)
        beams, beam_scores = sampler(next, prompt, cache, start, padding_mask, [EOS])
        beams, beam_scores = np.asarray(beams), np.asarray(beam_scores)
        for b in range(2):
            live = np.isfinite(beam_scores[b])
            found = answers(beams[b][live], padding_mask[[b] * int(live.sum())])
            members = index.lookup_item_ids(found)
            # Exhaustive: every tokenization of every allowed member, no other.
            expected = [s for s in sequences if index.lookup_item_ids([s])[0] in allowed]
            assert sorted(found) == sorted(expected), kwargs
            assert set(members.tolist()) == allowed
    with pytest.raises(ValueError, match="No eligibility set 'de'"):
        ConstrainedBeamSampler(layer, num_beams=2, eligibility_set="de")
    with pytest.raises(ValueError, match="need a constraint built with eligibility sets"):
        ConstrainedBeamSampler(index, num_beams=2, excluded_item_ids=[1])


def test_narrow_beams_never_choose_an_invalid_token(causal_lm, index):
    token_ids, padding_mask, _ = prompts([2, 3, 1, 2], seed=8)
    sampler = ConstrainedBeamSampler(index, num_beams=2, return_all_beams=True)
    next, prompt, cache, start = sampler_next(causal_lm, token_ids, padding_mask)
    beams, beam_scores = sampler(next, prompt, cache, start, padding_mask, [EOS])
    assert np.isfinite(np.asarray(beam_scores)).all()
    for b in range(4):
        found = answers(np.asarray(beams)[b], padding_mask[[b, b]])
        assert index.lookup_item_ids(found).min() >= 0


# The step decoder ------------------------------------------------------------


@pytest.mark.parametrize("lengths", [[3, 3], [1, 4, 2]])
def test_decoder_with_beam_search_matches_the_beam_sampler(causal_lm, index, lengths):
    token_ids, padding_mask, rows = prompts(lengths, seed=9)
    decoder = CausalLMDecoder(causal_lm)
    out = beam_search(
        StringConstrainedDecoding(index),
        decoder,
        len(lengths),
        13,
        initial_state=decoder.initial_state(token_ids, padding_mask),
    )
    tokens, beam_scores = np.asarray(out["tokens"]), np.asarray(out["scores"])
    generated, _ = generate(
        causal_lm, ConstrainedBeamSampler(index, num_beams=13), token_ids, padding_mask
    )
    for b, (prompt, answer) in enumerate(zip(rows, answers(generated, padding_mask))):
        assert [t for t in tokens[b, 0].tolist() if t >= 0] == answer
        live = np.isfinite(beam_scores[b])
        assert live.sum() == len(STRINGS)  # one result per member (distinct_items)
        found = [[t for t in row if t >= 0] for row in tokens[b][live].tolist()]
        np.testing.assert_allclose(
            beam_scores[b][live], scores(causal_lm, prompt, found), rtol=1e-4
        )


def test_decoder_logits_equal_the_full_forward_pass(causal_lm):
    lengths = [2, 5, 3]
    token_ids, padding_mask, rows = prompts(lengths, seed=10)
    decoder = CausalLMDecoder(causal_lm)
    state = decoder.initial_state(token_ids, padding_mask)
    answer = np.array([[1, 4], [2, 0], [5, 5]], "int32")
    for step in range(3):
        logits, state = decoder(answer[:, :step], state)
        for b, prompt in enumerate(rows):
            expected = last_log_probs(causal_lm, list(prompt) + answer[b, :step].tolist())
            got = np.asarray(logits)[b]
            np.testing.assert_allclose(got - np.logaddexp.reduce(got), expected, atol=1e-4)


def test_decoder_arguments_are_checked(causal_lm):
    with pytest.raises(ValueError, match="`causal_lm` must be a keras_hub.models.CausalLM"):
        CausalLMDecoder(keras.Sequential())
    decoder = CausalLMDecoder(causal_lm)
    token_ids = np.zeros((2, 4), "int32")
    with pytest.raises(ValueError, match="at least one prompt token"):
        decoder.initial_state(token_ids, np.array([[True] * 2 + [False] * 2, [False] * 4]))
    with pytest.raises(ValueError, match="right padding"):
        decoder.initial_state(token_ids, np.array([[True, False, True, False]] * 2))
    with pytest.raises(ValueError, match="room for the answer"):
        decoder.initial_state(token_ids, np.ones((2, 4), bool))


# Semantic IDs ----------------------------------------------------------------


def test_semantic_id_greedy_equals_the_reference_and_ends_with_the_stop_token(
    causal_lm, semantic_index
):
    lengths = [2, 4, 1]
    token_ids, padding_mask, rows = prompts(lengths, seed=11)
    out, out_mask = generate(causal_lm, ConstrainedSampler(semantic_index), token_ids, padding_mask)
    for row, n, prompt in zip(out, lengths, rows):
        answer = row[n : n + 3].tolist()
        assert semantic_index.contains([answer])[0]
        assert answer == reference_greedy_semantic(causal_lm, semantic_index, prompt)
        assert row[n + 3] == EOS  # the stop token follows the semantic ID
    assert (out_mask.sum(axis=1) == np.array(lengths) + 4).all()


def test_semantic_id_end_token_is_required_without_stop_tokens(causal_lm, semantic_index):
    token_ids, padding_mask, _ = prompts([2], seed=12)
    with pytest.raises(ValueError, match="pass `end_token_id`"):
        generate(causal_lm, ConstrainedSampler(semantic_index), token_ids, padding_mask, stop=None)
    sampler = ConstrainedSampler(semantic_index, end_token_id=PAD)
    out, _ = generate(causal_lm, sampler, token_ids, padding_mask, stop=None)
    assert semantic_index.contains([out[0, 2:5]])[0] and (out[0, 5:] == PAD).all()


def test_semantic_id_beams_equal_the_oracle_and_beam_search(causal_lm, semantic_index):
    lengths = [3, 1]
    token_ids, padding_mask, rows = prompts(lengths, seed=13)
    sequences = semantic_index.sequences().tolist()
    out, _ = generate(
        causal_lm, ConstrainedBeamSampler(semantic_index, num_beams=6), token_ids, padding_mask
    )
    decoder = CausalLMDecoder(causal_lm)
    searched = beam_search(
        semantic_index, decoder, 2, 6, initial_state=decoder.initial_state(token_ids, padding_mask)
    )
    for b, (n, prompt) in enumerate(zip(lengths, rows)):
        oracle = best(causal_lm, prompt, sequences)
        assert out[b, n : n + 3].tolist() == oracle and out[b, n + 3] == EOS
        assert np.asarray(searched["tokens"])[b, 0].tolist() == oracle
        assert np.asarray(searched["item_ids"])[b, 0] == 100 + sequences.index(oracle)


def test_static_keras_does_not_import_keras_hub():
    code = (
        "import sys, static_keras\n"
        "from static_keras import StaticIndex, StringIndex, TokenVocabulary\n"
        "print('keras_hub' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"
