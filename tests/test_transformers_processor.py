"""`TransformersLogitsProcessor` inside Hugging Face `generate()`.

Tiny GPT-2 models with random weights, built from a config (nothing is
downloaded). At every step the mask the processor applied is compared with
`StringLogitsProcessor.allowed` at the state an oracle gets by re-walking the
row's generated tokens from state 0; every answer must be a member; and with
a beam at least the number of token paths, beam search must return exactly
the paths ranked by an exhaustive teacher-forced scoring of every
tokenization of every member.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the transformers processor tests need torch")
if "tensorflow" in sys.modules and "triton" not in sys.modules:
    # conftest's keras loaded TensorFlow; transformers imports torch._dynamo,
    # which loads triton when installed (xgrammar pulls it in), and two LLVMs
    # in one process abort it ("Option ... registered more than once"). These
    # CPU tests need no triton: hide it for that import only.
    sys.modules["triton"] = None
    try:
        import torch._dynamo  # noqa: F401
    finally:
        del sys.modules["triton"]
transformers = pytest.importorskip(
    "transformers", reason="the transformers processor tests need transformers"
)

from static_keras.index.eligibility import EligibilitySets  # noqa: E402
from static_keras.strings import StringIndex  # noqa: E402
from static_keras.strings import StringLogitsProcessor  # noqa: E402
from static_keras.strings import TokenVocabulary  # noqa: E402
from static_keras.strings import TransformersLogitsProcessor  # noqa: E402
from static_keras.strings.transformers_processor import max_padding_columns  # noqa: E402

_GPT2_GGUF = os.path.join(
    os.path.dirname(__file__), "..", "..", "shared", "data", "vocab", "ggml-vocab-gpt-2.gguf"
)

# Multi-byte tokens (members have several tokenizations) and a character cut
# in halves ("é" is b"\xc3\xa9"). Two padding columns beyond the index's vocabulary.
TOKENS = [b"c", b"a", b"t", b"r", b"d", b"o", b"g", b"ca", b"at", b"ar", b"car", b"do", b"og"]
TOKENS += [b"\xc3", b"\xa9", "é".encode(), b"<pad>", b"<eos>"]
PAD, EOS = len(TOKENS) - 2, len(TOKENS) - 1
MEMBERS = ["cat", "cart", "dog", "do", "é"]
MODEL_WIDTH = len(TOKENS) + 2


@pytest.fixture(scope="module")
def vocab():
    return TokenVocabulary.from_token_bytes(TOKENS, special=[PAD, EOS], eos_token_id=EOS)


@pytest.fixture(scope="module")
def index(vocab):
    return StringIndex.from_strings(MEMBERS, vocab)


def tiny_gpt2(vocab_size, eos, pad, seed=0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=vocab_size, n_positions=64, n_layer=2, n_head=2, n_embd=32,
        bos_token_id=eos, eos_token_id=eos, pad_token_id=pad,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def model():
    return tiny_gpt2(MODEL_WIDTH, EOS, PAD)


def left_padded(prompts, pad):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


class Recorder:
    """Runs after the processor: keeps each step's ids and unmasked columns."""

    def __init__(self):
        self.steps = []

    def __call__(self, input_ids, scores):
        self.steps.append((input_ids.numpy().copy(), (scores != float("-inf")).numpy()))
        return scores


def oracle_state(index, answer):
    """The state after `answer`, walked from 0 (sticky after EOS or leaving)."""
    state = 0
    for token in answer:
        if state < 0 or index.is_finished([state])[0]:
            continue
        state = int(index.next_states([state], [int(token)])[0])
    return state


def oracle_allowed(index, answer, width, pad, **subsets):
    state = oracle_state(index, answer)
    allowed = np.zeros(width, bool)
    allowed[: index.vocab_size] = StringLogitsProcessor(
        index, eligibility=subsets.pop("eligibility", None)
    ).allowed([state], **subsets)[0]
    if index.is_finished([state])[0]:
        allowed[:] = False
        allowed[[index.eos_token_id, pad]] = True
    elif not allowed.any():
        allowed[index.eos_token_id] = True
    return allowed


def check_masks(index, recorder, prompt_width, pad, subsets_of_row=None):
    assert recorder.steps
    for step, (ids, unmasked) in enumerate(recorder.steps):
        assert ids.shape[1] == prompt_width + step
        for row in range(ids.shape[0]):
            subsets = {} if subsets_of_row is None else subsets_of_row(row, ids.shape[0])
            expected = oracle_allowed(
                index, ids[row, prompt_width:], unmasked.shape[1], pad, **subsets
            )
            np.testing.assert_array_equal(unmasked[row], expected, err_msg=f"step {step} row {row}")


def answers(vocab, sequences, prompt_width, eos):
    found = []
    for row in np.asarray(sequences)[:, prompt_width:].tolist():
        found.append(vocab.decode(row[: row.index(eos)]).decode() if eos in row else None)
    return found


PROMPTS = [[1, 2], [3, 4, 5, 6], [7]]
MODES = {
    "greedy": dict(do_sample=False),
    "sample": dict(do_sample=True, top_k=0),
    "sample_n": dict(do_sample=True, top_k=0, num_return_sequences=3),
    "beam": dict(num_beams=4, num_return_sequences=2),
    "beam_sample": dict(num_beams=3, do_sample=True, top_k=0),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_mask_follows_the_oracle_and_answers_are_members(mode, model, vocab, index):
    ids, mask = left_padded(PROMPTS, PAD)
    processor = TransformersLogitsProcessor(index, pad_token_id=PAD)
    recorder = Recorder()
    torch.manual_seed(1)
    kwargs = processor.generate_kwargs()
    kwargs["logits_processor"] = [processor, recorder]
    out = model.generate(input_ids=ids, attention_mask=mask, **kwargs, **MODES[mode])
    check_masks(index, recorder, ids.shape[1], PAD)
    found = answers(vocab, out, ids.shape[1], EOS)
    assert len(found) == len(PROMPTS) * MODES[mode].get("num_return_sequences", 1)
    assert set(found) <= set(MEMBERS), found
    item_ids = processor.item_ids(out)
    assert (item_ids >= 0).all()
    assert [MEMBERS[i] for i in item_ids] == found == processor.members(out)


def tokenizations(member: bytes, vocab):
    """Every token sequence spelling `member` (text tokens only), by brute force."""
    if not member:
        return [[]]
    paths = []
    for token, piece in enumerate(vocab.token_bytes):
        if piece and not vocab.special[token] and member.startswith(piece):
            paths += [[token] + rest for rest in tokenizations(member[len(piece) :], vocab)]
    return paths


def path_scores(model, prompt_ids, prompt_mask, paths):
    """Teacher-forced sum of log-softmax along each path (EOS included)."""
    width = prompt_ids.shape[0] + max(len(p) for p in paths)
    ids = torch.full((len(paths), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(paths), width), dtype=torch.long)
    for row, path in enumerate(paths):
        ids[row, : prompt_ids.shape[0]] = prompt_ids
        ids[row, prompt_ids.shape[0] : prompt_ids.shape[0] + len(path)] = torch.tensor(path)
        mask[row, : prompt_ids.shape[0]] = prompt_mask
        mask[row, prompt_ids.shape[0] : prompt_ids.shape[0] + len(path)] = 1
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    scores = []
    for row, path in enumerate(paths):
        at = prompt_ids.shape[0] - 1 + np.arange(len(path))
        scores.append(float(log_probs[row, at, path].sum()))
    return np.array(scores)


def test_beam_search_is_exhaustive_with_a_beam_of_every_path(model, vocab, index):
    paths, owner = [], []
    for item, member in enumerate(MEMBERS):
        for path in tokenizations(member.encode(), vocab):
            paths.append(path + [EOS])
            owner.append(item)
    assert 12 < len(paths) <= 30
    ids, mask = left_padded(PROMPTS[:2], PAD)
    processor = TransformersLogitsProcessor(index, pad_token_id=PAD)
    beams = len(paths)
    out = model.generate(
        input_ids=ids, attention_mask=mask, **processor.generate_kwargs(), num_beams=beams,
        num_return_sequences=beams, length_penalty=0.0, early_stopping="never",
        output_scores=True, return_dict_in_generate=True,
    )  # fmt: skip
    scores = out.sequences_scores.numpy().reshape(len(ids), beams)
    sequences = out.sequences.numpy().reshape(len(ids), beams, -1)
    for row in range(len(ids)):
        exhaustive = path_scores(model, ids[row], mask[row], paths)
        # Every path comes back, each with its teacher-forced score, best first.
        returned = [s[ids.shape[1] :].tolist() for s in sequences[row]]
        returned = [tuple(r[: r.index(EOS) + 1]) for r in returned]
        assert sorted(returned) == sorted(tuple(p) for p in paths)
        expected = {tuple(p): s for p, s in zip(paths, exhaustive)}
        np.testing.assert_allclose(scores[row], [expected[r] for r in returned], atol=2e-4)
        assert np.all(np.diff(scores[row]) <= 1e-6)
        best = int(np.argmax(exhaustive))
        assert processor.item_ids(sequences[row])[0] == owner[best]
        np.testing.assert_allclose(scores[row, 0], exhaustive[best], atol=2e-4)


def test_per_batch_row_subsets_with_beams(model, vocab, index):
    sets = EligibilitySets.build(index, {"pets": [0, 2]})  # cat, dog
    base = StringLogitsProcessor(index, eligibility=sets)
    set_ids = np.array([sets.set_id("pets"), -1, -1])
    excluded = np.array([[-1], [3], [-1]])  # batch row 1 must not answer "do"
    processor = TransformersLogitsProcessor(
        base, pad_token_id=PAD, set_ids=set_ids, excluded_item_ids=excluded
    )
    ids, mask = left_padded(PROMPTS, PAD)
    recorder, beams = Recorder(), 3
    kwargs = processor.generate_kwargs()
    kwargs["logits_processor"] = [processor, recorder]
    out = model.generate(
        input_ids=ids, attention_mask=mask, **kwargs, num_beams=beams, num_return_sequences=beams
    )

    def subsets_of_row(row, rows):
        batch_row = row // (rows // len(PROMPTS))
        return dict(
            eligibility=sets,
            set_ids=set_ids[batch_row : batch_row + 1],
            excluded_item_ids=excluded[batch_row : batch_row + 1],
        )

    check_masks(index, recorder, ids.shape[1], PAD, subsets_of_row)
    found = np.array(answers(vocab, out, ids.shape[1], EOS), object).reshape(len(PROMPTS), beams)
    assert set(found[0]) <= {"cat", "dog"} and "do" not in found[1]
    assert (processor.item_ids(out) >= 0).all()


def test_a_row_with_nothing_left_ends_at_once_without_nan(model, index):
    # Batch row 0 excludes every member: it may only emit EOS (no NaN in sampling).
    excluded = np.array([list(range(len(MEMBERS))), [-1] * len(MEMBERS)])
    processor = TransformersLogitsProcessor(index, pad_token_id=PAD, excluded_item_ids=excluded)
    ids, mask = left_padded(PROMPTS[:2], PAD)
    torch.manual_seed(0)
    out = model.generate(
        input_ids=ids, attention_mask=mask, **processor.generate_kwargs(), do_sample=True
    )
    assert out[0, ids.shape[1]].item() == EOS
    assert processor.item_ids(out)[0] == -1 and processor.members(out)[0] is None
    assert processor.members(out)[1] in MEMBERS


@pytest.mark.skipif(
    not os.path.isfile(_GPT2_GGUF), reason="needs ../shared/data/vocab (GPT-2 GGUF)"
)
@pytest.mark.parametrize("mode", ["greedy", "beam"])
def test_real_gpt2_vocabulary(mode):
    vocab = TokenVocabulary.load(_GPT2_GGUF)
    members = ["get_weather", "search_web", "Paris", "東京都", " New York"]
    index = StringIndex.from_strings(members, vocab)
    model = tiny_gpt2(vocab.vocab_size, index.eos_token_id, index.eos_token_id)
    ids, mask = left_padded([[464, 3139], [40, 588, 284, 1100, 257]], index.eos_token_id)
    processor = TransformersLogitsProcessor(index)
    recorder = Recorder()
    kwargs = processor.generate_kwargs()
    kwargs["logits_processor"] = [processor, recorder]
    options = dict(num_beams=4, num_return_sequences=2) if mode == "beam" else {}
    out = model.generate(input_ids=ids, attention_mask=mask, **kwargs, **options)
    check_masks(index, recorder, ids.shape[1], index.eos_token_id)
    found = answers(vocab, out, ids.shape[1], index.eos_token_id)
    assert set(found) <= set(members) and None not in found
    assert processor.members(out) == found


def test_rows_are_not_rewalked_and_a_reused_processor_starts_over(model, index, monkeypatch):
    processor = TransformersLogitsProcessor(index, pad_token_id=PAD)
    walked = []
    original = processor._walk
    monkeypatch.setattr(processor, "_walk", lambda a: walked.append(a.size) or original(a))
    results = []
    for prompts in (PROMPTS, [[5, 5, 5, 5, 5, 5]], PROMPTS):
        ids, mask = left_padded(prompts, PAD)
        out = model.generate(
            input_ids=ids, attention_mask=mask, **processor.generate_kwargs(), num_beams=4
        )
        assert walked == []  # each row's parent prefix was in the cache: no walk
        results.append(processor.item_ids(out).tolist())
        assert processor.prompt_length == ids.shape[1]
        walked.clear()
    assert results[0] == results[2]
    assert all(i >= 0 for r in results for i in r)


def test_explicit_prompt_length_and_prefix_allowed_tokens_fn(model, vocab, index):
    ids, mask = left_padded(PROMPTS, PAD)
    processor = TransformersLogitsProcessor(index, prompt_length=ids.shape[1], pad_token_id=PAD)
    kwargs = processor.generate_kwargs()
    expected = model.generate(input_ids=ids, attention_mask=mask, **kwargs, num_beams=3)
    del kwargs["logits_processor"]
    out = model.generate(
        input_ids=ids, attention_mask=mask, **kwargs, num_beams=3,
        prefix_allowed_tokens_fn=processor.prefix_allowed_tokens_fn,
    )  # fmt: skip
    np.testing.assert_array_equal(out.numpy(), expected.numpy())
    assert set(processor.members(out)) <= set(MEMBERS)


def test_bad_inputs_raise_value_errors(model, vocab, index):
    small = tiny_gpt2(len(TOKENS) - 1, 0, 0)
    processor = TransformersLogitsProcessor(index)
    ids = torch.tensor([[1, 2]])
    with pytest.raises(ValueError, match=r"scores have 17 columns .* vocabulary of 18 tokens"):
        small.generate(input_ids=ids, logits_processor=[processor], max_new_tokens=2)
    # A model far wider than the index's vocabulary (GPT-2's index under a
    # Qwen2-sized model): another tokenizer, refused; padding columns are fine.
    wide = index.vocab_size + max_padding_columns(index.vocab_size)
    processor(ids, torch.zeros(1, wide))
    with pytest.raises(ValueError, match=r"scores have 1,043 columns, 1,025 more than the 18"):
        processor(ids, torch.zeros(1, wide + 1))
    with pytest.raises(ValueError, match="StringIndex or a StringLogitsProcessor"):
        TransformersLogitsProcessor(vocab)
    with pytest.raises(ValueError, match="prompt_length"):
        TransformersLogitsProcessor(index).item_ids(np.zeros((1, 3), int))
    with pytest.raises(ValueError, match="fewer than the prompt length 5"):
        TransformersLogitsProcessor(index, prompt_length=5).item_ids(np.zeros((1, 3), int))
    with pytest.raises(ValueError, match="pad_token_id"):
        TransformersLogitsProcessor(index, pad_token_id=MODEL_WIDTH)(
            ids, torch.zeros(1, MODEL_WIDTH)
        )
    with pytest.raises(ValueError, match="eligibility"):
        TransformersLogitsProcessor(index, set_ids=[0])
    with pytest.raises(ValueError, match="multiple of the 2 batch rows"):
        sets = EligibilitySets.build(index, {"pets": [0]})
        TransformersLogitsProcessor(
            StringLogitsProcessor(index, eligibility=sets), set_ids=[0, -1]
        )(torch.zeros((3, 1), dtype=torch.long), torch.zeros(3, MODEL_WIDTH))


def test_importing_the_package_and_module_imports_no_torch():
    code = (
        "import sys\n"
        "from static_keras.strings import TransformersLogitsProcessor\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
