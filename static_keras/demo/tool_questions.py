"""The strings demo's data: "which API operation does this?" from botocore.

botocore ships the service models of every AWS API (`botocore/data/<service>/
<version>/service-2.json[.gz]`): each operation has a name (`CreateBucket`)
and documentation whose first sentence says what it does ("Creates a new S3
bucket."). A question is such a first sentence, its answer the operation
name: the tool-selection task of an LLM agent, on 15,000 real tool names.

A sentence that documents operations of different names is dropped (no
single right answer); identical sentences are merged, so no held-out
question is also a training question. The answer set is every answer,
held-out ones included: some held-out answers never occur in training, and
a model can only produce those by generalising from the words.
"""

from __future__ import annotations

import dataclasses
import gzip
import html
import json
import os
import re

import numpy as np

_TAG = re.compile(r"<[^>]+>")
# A period that ends a sentence: followed by a space or the end, not "e.g." or "i.e.".
_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\.(?=\s|$)")
MIN_QUESTION_CHARS = 10


@dataclasses.dataclass(frozen=True)
class ToolQuestions:
    """Questions (first sentences) and answers (operation names), split.

    Attributes:
        train: list of `(question, answer)` the model learns from.
        held_out: list of `(question, answer)` it is evaluated on.
        answers: sorted list of every distinct answer (train and held out):
            the constraint set.
        ambiguous: int, sentences dropped because they document operations
            of different names.
        source: str, where the data came from (package and version).
    """

    train: list
    held_out: list
    answers: list
    ambiguous: int
    source: str


def first_sentence(documentation: str) -> str:
    """The first sentence of an HTML documentation string, as plain text."""
    text = " ".join(html.unescape(_TAG.sub(" ", documentation)).split())
    end = _SENTENCE_END.search(text)
    return text[: end.end()] if end else text


def load_operations() -> list[tuple[str, str, str]]:
    """`(service, operation name, documentation)` of every service's newest API version."""
    try:
        import botocore
    except ImportError as error:
        raise ImportError(
            "The strings demo reads its questions from botocore's service models: "
            "pip install 'static-keras[strings-demo]'"
        ) from error
    data = os.path.join(os.path.dirname(botocore.__file__), "data")
    operations = []
    for service in sorted(os.listdir(data)):
        versions = sorted(v for v in _subdirectories(os.path.join(data, service)))
        for version in reversed(versions):  # the newest version with a service model
            model = _read_service_model(os.path.join(data, service, version))
            if model is not None:
                for name, operation in model["operations"].items():
                    operations.append((service, name, operation.get("documentation", "")))
                break
    return operations


def make_tool_questions(
    *, held_out: int, train_limit: int | None = None, seed: int = 0
) -> ToolQuestions:
    """Questions from botocore, `held_out` of them set aside at random.

    Args:
        held_out: int. Questions to evaluate on.
        train_limit: int or None. At most this many training questions (a
            quick run); the answer set stays the full one.
        seed: int. Seeds the split.
    """
    import botocore

    names_by_sentence: dict[str, set[str]] = {}
    for _, name, documentation in load_operations():
        sentence = first_sentence(documentation)
        if len(sentence) >= MIN_QUESTION_CHARS:
            names_by_sentence.setdefault(sentence, set()).add(name)
    pairs = sorted((s, next(iter(n))) for s, n in names_by_sentence.items() if len(n) == 1)
    if not 0 < held_out < len(pairs):
        raise ValueError(f"`held_out` must be in [1, {len(pairs)}). Received: held_out={held_out}")
    order = np.random.default_rng(seed).permutation(len(pairs))
    test = [pairs[i] for i in order[:held_out]]
    train = [pairs[i] for i in order[held_out:][:train_limit]]
    return ToolQuestions(
        train=train,
        held_out=test,
        answers=sorted({answer for _, answer in pairs}),
        ambiguous=len(names_by_sentence) - len(pairs),
        source=f"botocore {botocore.__version__}",
    )


def _subdirectories(path: str) -> list[str]:
    if not os.path.isdir(path):
        return []
    return [name for name in os.listdir(path) if os.path.isdir(os.path.join(path, name))]


def _read_service_model(version_dir: str) -> dict | None:
    """The version's `service-2.json` (newer botocore compresses it), or None."""
    for name, opener in (("service-2.json.gz", gzip.open), ("service-2.json", open)):
        path = os.path.join(version_dir, name)
        if os.path.exists(path):
            with opener(path, "rt", encoding="utf-8") as file:
                return json.load(file)
    return None
