"""`static-keras demo --strings`: a weak model constrained to its answer set.

The trie-automaton paper's headline for LLM users is that constraining a
weak model to the label set raises its accuracy (Banking77: 4.8% -> 24.8%).
This demo measures the same effect here, end to end, in a few minutes on a
CPU:

1. Questions from botocore (`tool_questions`): an AWS operation's first
   documentation sentence; the answer is the operation's name, one of about
   15,000. Held-out questions are set aside; the answer set (the constraint)
   holds every answer, held-out ones included.
2. A byte-level BPE trained here with `tokenizers` on the training text, so
   an answer has many tokenizations; `TokenVocabulary` reads it.
3. A small Keras transformer decoder (`CachedTransformerDecoder`) trained
   with teacher forcing for at most a few minutes: a weak model.
4. Held-out questions decoded by the same beam search, over the full
   vocabulary and constrained to the answer set (`StringIndex`): validity
   (the answer is a member), exact-match accuracy and time per answer.
"""

from __future__ import annotations

import os
import sys
import time

import keras
import numpy as np

from static_keras.decoding.constrained_beam_search import ConstrainedBeamSearch
from static_keras.demo.demo_failure import DemoFailure
from static_keras.demo.string_report import write_strings_report
from static_keras.demo.tool_questions import make_tool_questions
from static_keras.layers.cached_transformer_decoder import CachedTransformerDecoder
from static_keras.layers.cached_transformer_decoder import TeacherForcing
from static_keras.strings import StringIndex
from static_keras.strings import TokenVocabulary

EOS = "<|endoftext|>"
QUESTION_TOKENS = 48  # a first sentence is about 15 tokens; longer ones are cut
# Steps beyond the longest canonical tokenization: the constraint allows every
# spelling of an answer, and a constrained beam that runs out of steps is dropped.
EXTRA_STEPS = 6


def _settings(quick: bool) -> dict:
    if quick:
        return dict(held_out=100, train_limit=2_000, bpe_vocab=1_024, hidden=32, layers=1,
                    epochs=3, train_budget_s=60, beams=(1, 4), batch=50)  # fmt: skip
    return dict(held_out=1_000, train_limit=None, bpe_vocab=4_096, hidden=64, layers=2,
                epochs=6, train_budget_s=170, beams=(1, 4), batch=100)  # fmt: skip


def run_strings_demo(
    out_dir: str = "static_keras_strings_demo",
    *,
    quick: bool = False,
    seed: int = 0,
    print_fn=print,
) -> dict:
    """Runs the demo, writes `out_dir/report.md` and its plot, returns the numbers.

    Raises:
        DemoFailure: if a constrained answer is not a member of the answer set.
    """
    cfg = _settings(quick)
    keras.utils.set_random_seed(seed)
    started = time.perf_counter()
    data = make_tool_questions(held_out=cfg["held_out"], train_limit=cfg["train_limit"], seed=seed)
    trained_answers = {answer for _, answer in data.train}
    print_fn(f"questions: {len(data.train):,} to train on, {len(data.held_out):,} held out "
             f"({data.source}); answer set: {len(data.answers):,} operation names")  # fmt: skip

    tokenizer, vocab = train_tokenizer(data.train, cfg["bpe_vocab"])
    canonical = max(len(ids) for ids in _encode(tokenizer, data.answers))
    compile_start = time.perf_counter()
    index = StringIndex.from_strings(data.answers, vocab, max_length=canonical + 1 + EXTRA_STEPS)
    compile_ms = 1e3 * (time.perf_counter() - compile_start)
    print_fn(f"tokenizer: byte-level BPE of {vocab.vocab_size:,} tokens; answers take up to "
             f"{canonical} tokens; {index} compiled in {compile_ms:.0f} ms")  # fmt: skip

    decoder, training = train_decoder(data.train, tokenizer, vocab, index.length, cfg, seed)
    seconds, epochs = training["train_seconds"], training["epochs_trained"]
    print_fn(f"decoder: {training['parameters']:,} parameters, trained {seconds:.0f} s "
             f"({epochs:.2f} epochs)")  # fmt: skip

    contexts = encode_questions(tokenizer, [q for q, _ in data.held_out])
    gold = [answer for _, answer in data.held_out]
    decodings = [(beam, constrained) for beam in cfg["beams"] for constrained in (False, True)]
    models = [
        search_model(decoder, index if constrained else None, beam, index.length)
        for beam, constrained in decodings
    ]
    outputs, seconds = decode_timed(models, contexts, cfg["batch"])
    member = set(data.answers)
    unseen = np.array([answer not in trained_answers for answer in gold])
    rows = []
    for (beam, constrained), out, per_answer in zip(decodings, outputs, seconds):
        answers = answers_from_tokens(out["tokens"][:, 0], vocab)
        if constrained:
            _check_members(answers, out["item_ids"][:, 0], data.answers)
        name = f"constrained to {len(data.answers):,} names" if constrained else "unconstrained"
        rows.append(dict(name=name, beam=beam, constrained=constrained, answers=answers,
                         **score_answers(answers, gold, member, unseen),
                         ms_per_answer=1e3 * float(np.median(per_answer))))  # fmt: skip

    results = dict(
        source=data.source, num_train=len(data.train), num_held_out=len(gold),
        num_answers=len(data.answers), ambiguous=data.ambiguous,
        unseen_share=float(unseen.mean()), vocab_size=vocab.vocab_size,
        canonical_tokens=canonical, max_length=index.length, index_states=index.num_states,
        index_bytes=index.nbytes, compile_ms=compile_ms, batch=cfg["batch"], **training,
        decoding=rows, data=data, gold=gold,
    )  # fmt: skip
    print_table(results, print_fn)
    files = write_strings_report(out_dir, results)
    results["seconds"] = time.perf_counter() - started
    print_fn(f"\nwrote {', '.join(os.path.join(out_dir, f) for f in files)} "
             f"({results['seconds']:.0f} s in all)")  # fmt: skip
    return results


def train_tokenizer(train: list, vocab_size: int):
    """A byte-level BPE (GPT-2 style) trained on the training questions and answers only."""
    try:
        from tokenizers import Tokenizer
        from tokenizers import decoders
        from tokenizers import models
        from tokenizers import pre_tokenizers
        from tokenizers import trainers
    except ImportError as error:
        raise ImportError(
            "The strings demo trains a BPE with `tokenizers`: "
            "pip install 'static-keras[strings-demo]'"
        ) from error
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([text for pair in train for text in pair], trainer=trainer)
    return tokenizer, TokenVocabulary.from_tokenizer_json(tokenizer)


def encode_questions(tokenizer, questions: list) -> np.ndarray:
    """int32 `[N, QUESTION_TOKENS]`: token ids + 1 (0 pads the context)."""
    contexts = np.zeros((len(questions), QUESTION_TOKENS), np.int32)
    for row, ids in enumerate(_encode(tokenizer, questions)):
        ids = ids[:QUESTION_TOKENS]
        contexts[row, : len(ids)] = np.asarray(ids) + 1
    return contexts


def encode_answers(tokenizer, answers: list, length: int, eos: int) -> np.ndarray:
    """int32 `[N, length]`: each answer's canonical tokens, then EOS to the end.

    EOS after EOS is learned too, so the unconstrained search, which runs all
    `length` steps, adds about nothing to a finished answer's score.
    """
    targets = np.full((len(answers), length), eos, np.int32)
    for row, ids in enumerate(_encode(tokenizer, answers)):
        targets[row, : len(ids)] = ids
    return targets


class _TimeBudget(keras.callbacks.Callback):
    """Stops training after `seconds`: the demo promises a bound on a small CPU."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds
        self.steps = 0

    def on_train_begin(self, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if time.perf_counter() - self.start > self.seconds:
            self.model.stop_training = True


def train_decoder(train, tokenizer, vocab, length: int, cfg: dict, seed: int):
    """A small transformer decoder trained with teacher forcing; returns it and its stats."""
    keras.utils.set_random_seed(seed)
    vocab_size = vocab.vocab_size
    decoder = CachedTransformerDecoder(
        vocab_size, length, context_vocab_size=vocab_size + 1, hidden_dim=cfg["hidden"],
        num_heads=4, num_layers=cfg["layers"],
    )  # fmt: skip
    decoder.build()
    question_in = keras.Input((QUESTION_TOKENS,), dtype="int32", name="question")
    answer_in = keras.Input((length,), dtype="int32", name="answer")
    trainer = keras.Model([question_in, answer_in], TeacherForcing(decoder)(question_in, answer_in))
    trainer.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    contexts = encode_questions(tokenizer, [q for q, _ in train])
    targets = encode_answers(tokenizer, [a for _, a in train], length, vocab.eos_token_id)
    budget = _TimeBudget(cfg["train_budget_s"])
    batch_size = 128
    begin = time.perf_counter()
    trainer.fit(
        [contexts, targets], targets, batch_size=batch_size, epochs=cfg["epochs"],
        callbacks=[budget], verbose=1 if sys.stdout.isatty() else 2,
    )  # fmt: skip
    seconds = time.perf_counter() - begin
    steps_per_epoch = -(-len(train) // batch_size)
    return decoder, dict(
        train_seconds=seconds, epochs_trained=budget.steps / steps_per_epoch,
        parameters=int(sum(np.prod(w.shape) for w in decoder.weights)),
        train_budget_seconds=cfg["train_budget_s"],
    )  # fmt: skip


def search_model(decoder, index, beam: int, length: int) -> keras.Model:
    """question `[B, QUESTION_TOKENS]` -> the best answer; `index=None`: unconstrained."""
    question = keras.Input((QUESTION_TOKENS,), dtype="int32", name="question")
    search = ConstrainedBeamSearch(
        index, decoder, beam_size=beam, num_results=1, length=None if index is not None else length
    )
    return keras.Model(question, search(question))


def decode_timed(models, contexts: np.ndarray, batch: int):
    """Every model's outputs on all contexts, and its seconds per answer for each batch.

    On a shared CPU the speed drifts over seconds: batch by batch the models
    take turns, starting one later each batch, so each sees the same drift.
    """
    if len(contexts) % batch:
        raise ValueError(f"{len(contexts)} questions are not a multiple of batch={batch}")
    for model in models:
        model.predict_on_batch(contexts[:batch])  # traces the search once per model
    outputs = [[] for _ in models]
    seconds = [[] for _ in models]
    for turn, start in enumerate(range(0, len(contexts), batch)):
        chunk = contexts[start : start + batch]
        for i in np.roll(np.arange(len(models)), -turn):
            begin = time.perf_counter()
            out = models[i].predict_on_batch(chunk)
            seconds[i].append((time.perf_counter() - begin) / batch)
            outputs[i].append({k: keras.ops.convert_to_numpy(v) for k, v in out.items()})
    merged = [{k: np.concatenate([o[k] for o in outs]) for k in outs[0]} for outs in outputs]
    return merged, seconds


def answers_from_tokens(tokens: np.ndarray, vocab: TokenVocabulary) -> list[str]:
    """Each row's text up to its first EOS (or padding); "" for no answer."""
    texts = []
    for row in np.asarray(tokens).tolist():
        ends = [i for i, token in enumerate(row) if token < 0 or token == vocab.eos_token_id]
        texts.append(vocab.decode(row[: ends[0]] if ends else row).decode("utf-8", "replace"))
    return texts


def score_answers(answers: list, gold: list, members: set, unseen: np.ndarray) -> dict:
    """Validity, exact-match accuracy (all and on answers unseen in training), no-answer share."""
    valid = np.array([answer in members for answer in answers])
    correct = np.array([answer == truth for answer, truth in zip(answers, gold)])
    return dict(
        validity=float(valid.mean()),
        accuracy=float(correct.mean()),
        accuracy_unseen=float(correct[unseen].mean()) if unseen.any() else float("nan"),
        no_answer=float(np.mean([answer == "" for answer in answers])),
    )


def print_table(results: dict, print_fn=print) -> None:
    print_fn("")
    print_fn(f"{'decoding':<30}{'beam':>5}{'valid':>8}{'accuracy':>10}{'unseen':>8}"
             f"{'no answer':>11}{'ms/answer':>11}")  # fmt: skip
    for row in results["decoding"]:
        print_fn(f"{row['name']:<30}{row['beam']:>5}{row['validity']:>8.1%}"
                 f"{row['accuracy']:>10.1%}{row['accuracy_unseen']:>8.1%}"
                 f"{row['no_answer']:>11.1%}{row['ms_per_answer']:>11.2f}")  # fmt: skip
    print_fn(f"(held-out questions: {results['num_held_out']:,}, of which "
             f"{results['unseen_share']:.0%} have an answer never seen in training ('unseen' "
             f"accuracy); ms/answer: median over batches of {results['batch']} of batch time / "
             f"{results['batch']})")  # fmt: skip


def _check_members(answers: list, item_ids: np.ndarray, members: list) -> None:
    """Every constrained answer is the member its item id names, or no answer at all."""
    for text, item in zip(answers, np.asarray(item_ids).tolist()):
        if (item < 0 and text) or (item >= 0 and text != members[item]):
            raise DemoFailure(f"constrained answer {text!r} is not member {item}")


def _encode(tokenizer, texts: list) -> list[list[int]]:
    return [encoding.ids for encoding in tokenizer.encode_batch(list(texts))]
