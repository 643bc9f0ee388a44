"""Make a language model answer with exactly one of K strings.

A tool router, a product classifier or a coding assistant must often answer
with one string out of a fixed list: a tool name, a category path, a medical
code. Under a real tokenizer every string can be spelled in many ways
(`"get_weather"` is `["get", "_weather"]`, `["g", "et", "_", "weather"]`, ...)
and a token may end in the middle of a UTF-8 character. `StringIndex`
compiles the K strings against the vocabulary into a trie automaton: at
every step, exactly the tokens that keep spelling some member are allowed,
plus EOS where a member is complete.

This script walks through the pieces, on a byte-level BPE vocabulary that it
trains itself with `tokenizers` (or on any real vocabulary file via
`--vocab`, e.g. a GGUF or `tokenizer.json`):

1. Compile the string set: `StringIndex.from_strings(strings, vocabulary)`.
   The vocabulary's token trie is built once and reused for every set.
2. Any decode loop, with the stateless `StringLogitsProcessor`: greedy and
   sampled decoding over a stand-in model; the processor masks the logits
   and advances one integer state per row. Every answer is a member.
3. Beam search inside a Keras model: `ConstrainedBeamSearch` over a small
   causal decoder (random weights) returns the best members per prompt, with
   `item_ids` = positions in the list.
4. keras-hub (optional): a `GPT2CausalLM` with random weights generates
   through a custom sampler that applies the same constraint inside
   `generate()`'s compiled loop.
5. Export (optional, `--export DIR`): the beam-search model as a SavedModel
   for TensorFlow Serving; the served answers are members too.

Run: `python examples/string_choice.py [--vocab PATH] [--export DIR]`.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from static_keras import CachedTransformerDecoder  # noqa: E402
from static_keras import ConstrainedBeamSearch  # noqa: E402
from static_keras.strings import StringIndex  # noqa: E402
from static_keras.strings import StringLogitsProcessor  # noqa: E402
from static_keras.strings import TokenVocabulary  # noqa: E402

TOOLS = [
    "get_weather",
    "get_weather_forecast",  # a member may extend another one
    "search_web",
    "search_flights",
    "book_flight",
    "send_email",
    "translate_text",
    "東京の天気",  # multi-byte UTF-8: tokens may cut characters
    "order_🍕",
]
EOS = "<|endoftext|>"


def train_vocabulary() -> TokenVocabulary:
    """A small byte-level BPE (GPT-2 style), trained on text written here."""
    try:
        from tokenizers import Tokenizer
        from tokenizers import decoders
        from tokenizers import models
        from tokenizers import pre_tokenizers
        from tokenizers import trainers
    except ImportError:
        print("(`tokenizers` is not installed: using a plain byte vocabulary)")
        tokens = [bytes([b]) for b in range(256)] + [b"get", b"_weather", b"search", EOS.encode()]
        return TokenVocabulary.from_token_bytes(
            tokens, special=[len(tokens) - 1], eos_token_id=len(tokens) - 1
        )
    text = (
        " ".join(TOOLS) * 5 + " the weather in Tokyo, search the web, book a flight, send an email"
    )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([text], trainer=trainer)
    return TokenVocabulary.from_tokenizer_json(tokenizer)


def decode_loops(index: StringIndex, vocab: TokenVocabulary) -> None:
    """Greedy and sampled decoding with the stateless logits processor."""
    processor = StringLogitsProcessor(index)
    rng = np.random.default_rng(0)
    rows = 4
    for mode in ("greedy", "sampling"):
        states = processor.initial_states(rows)
        answers = [[] for _ in range(rows)]
        for _ in range(index.length):
            logits = rng.normal(size=(rows, vocab.vocab_size)) * 3  # stand-in model
            masked = processor.mask_logits(logits, states)
            if mode == "greedy":
                tokens = masked.argmax(axis=1)
            else:
                probs = np.exp(masked - masked.max(axis=1, keepdims=True))
                probs /= probs.sum(axis=1, keepdims=True)
                tokens = np.array([rng.choice(vocab.vocab_size, p=p) for p in probs])
            states = processor.advance(states, tokens)
            for row, token in enumerate(tokens):
                answers[row].append(int(token))
            if processor.is_finished(states).all():
                break
        texts = [vocab.decode(a).decode() for a in answers]
        assert all(t in TOOLS for t in texts), texts
        print(f"  {mode:9s}: {texts}")


def beam_search_model(index: StringIndex, prompt_length: int = 8) -> keras.Model:
    """prompt [B, P] -> {tokens, scores, item_ids}: a causal decoder plus the index."""
    keras.utils.set_random_seed(0)
    decoder = CachedTransformerDecoder(
        index.vocab_size, index.length, context_vocab_size=index.vocab_size, hidden_dim=32
    )
    prompt = keras.Input((prompt_length,), dtype="int32", name="prompt")
    return keras.Model(prompt, ConstrainedBeamSearch(index, decoder, beam_size=4)(prompt))


def show_beams(out: dict, vocab: TokenVocabulary) -> None:
    for b, (tokens, scores, items) in enumerate(zip(out["tokens"], out["scores"], out["item_ids"])):
        answers = []
        for row, score, item in zip(tokens, scores, items):
            if item < 0:
                continue
            text = vocab.decode(row).decode()
            assert text == TOOLS[item], (text, item)
            answers.append(f"{text} ({score:.2f})")
        print(f"  prompt {b}: " + ", ".join(answers))


def keras_hub_generate(index: StringIndex, vocab: TokenVocabulary) -> None:
    """GPT2CausalLM.generate() with the library's constrained sampler."""
    try:
        import keras_hub

        from static_keras.keras_hub import ConstrainedSampler
    except ImportError:
        print("  (keras-hub is not installed: skipped)")
        return

    keras.utils.set_random_seed(1)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocab.vocab_size, num_layers=1, num_heads=2, hidden_dim=32,
        intermediate_dim=64, max_sequence_length=64,
    )  # fmt: skip
    causal_lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    # Greedy (k=1); ConstrainedSampler(index, k=5, seed=0) samples instead.
    causal_lm.compile(sampler=ConstrainedSampler(index))
    prompt_length, rows = 5, 3
    total = prompt_length + index.length
    token_ids = np.zeros((rows, total), "int32")
    token_ids[:, :prompt_length] = np.random.default_rng(2).integers(
        1, vocab.vocab_size, (rows, prompt_length)
    )
    padding = np.zeros((rows, total), bool)
    padding[:, :prompt_length] = True
    out = causal_lm.generate(
        {"token_ids": token_ids, "padding_mask": padding}, stop_token_ids=[index.eos_token_id]
    )
    for row in np.asarray(out["token_ids"])[:, prompt_length:]:
        answer = row.tolist()
        answer = (
            answer[: answer.index(index.eos_token_id)] if index.eos_token_id in answer else answer
        )
        text = vocab.decode(answer).decode()
        assert text in TOOLS, text
        print(f"  generated: {text!r}")


def export(model: keras.Model, index: StringIndex, vocab: TokenVocabulary, directory: str) -> None:
    import tensorflow as tf

    from static_keras.export import check_saved_model
    from static_keras.export import export_saved_model

    path = os.path.join(directory, "1")
    info = export_saved_model(model, path, warmup_batch_sizes=(1, 2))
    check_saved_model(path)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    prompts = np.random.default_rng(3).integers(1, vocab.vocab_size, (2, 8)).astype("int32")
    out = {k: v.numpy() for k, v in serve(prompt=tf.constant(prompts)).items()}
    print(f"  exported to {path} ({info.num_variables} variables); served answers:")
    show_beams(out, vocab)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Answer with one of K strings.")
    parser.add_argument("--vocab", help="a .gguf, .tiktoken or tokenizer.json vocabulary")
    parser.add_argument("--export", help="export the beam-search model under this directory")
    parser.add_argument("--max-length", type=int, default=12, help="decoding steps, EOS included")
    args = parser.parse_args(argv)

    vocab = TokenVocabulary.load(args.vocab) if args.vocab else train_vocabulary()
    print(f"vocabulary: {vocab}")
    index = StringIndex.from_strings(TOOLS, vocab, max_length=args.max_length)
    print(f"1. compiled: {index}")
    print("2. any decode loop (StringLogitsProcessor):")
    decode_loops(index, vocab)
    print("3. beam search in a Keras model (ConstrainedBeamSearch):")
    model = beam_search_model(index)
    prompts = np.random.default_rng(4).integers(1, vocab.vocab_size, (2, 8)).astype("int32")
    show_beams(model.predict(prompts, verbose=0), vocab)
    print("4. keras-hub CausalLM.generate() with a constrained sampler:")
    keras_hub_generate(index, vocab)
    if args.export:
        print("5. SavedModel export:")
        export(model, index, vocab, args.export)
    return 0


if __name__ == "__main__":
    sys.exit(main())
