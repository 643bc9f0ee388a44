"""Reading the usual tokenizer files into token bytes and special flags.

`TokenVocabulary.from_tokenizer_json`, `.from_gguf` and `.from_tiktoken`
call these; each returns the `TokenVocabulary` arguments (`token_bytes`,
`special`, `eos_token_id`, `name`):

- a Hugging Face `tokenizer.json` (needs the `tokenizers` package):
  byte-level BPE, SentencePiece with byte fallback, or plain text pieces;
  added tokens marked special are never allowed;
- a GGUF file (its metadata only, `gguf_metadata`, no dependency):
  `tokenizer.ggml.model` `gpt2` (byte-level BPE) or `llama` / `t5`
  (SentencePiece); token types control, unknown and unused are never
  allowed;
- a `.tiktoken` file: one `base64(bytes) rank` per line, no dependency;
  special tokens are given by the caller.

Padding rows (GGUF user-defined tokens and `tokenizer.json` added tokens
whose whole text matches `PADDING_PATTERN`) are special unless the caller
passes another pattern or None.
"""

from __future__ import annotations

import base64
import json
import os
import re
from typing import Sequence

import numpy as np

from static_keras.strings.byte_decoding import byte_fallback_value
from static_keras.strings.byte_decoding import decode_byte_level
from static_keras.strings.byte_decoding import decode_sentencepiece
from static_keras.strings.byte_decoding import is_byte_level
from static_keras.strings.gguf_metadata import read_gguf_metadata

#: GGUF token types (llama.cpp `llama_token_type`).
GGUF_NORMAL, GGUF_UNKNOWN, GGUF_CONTROL, GGUF_USER_DEFINED, GGUF_UNUSED, GGUF_BYTE = (
    1,
    2,
    3,
    4,
    5,
    6,
)

#: Added / user-defined tokens with these texts are padding or placeholder
#: rows of the embedding, not text (matched against the whole token text).
PADDING_PATTERN = (
    r"\[PAD\d*\]|<pad>|<\|pad\|>|<\|?PAD_?\d*\|?>|\[unused\d+\]|<unused\d+>|<extra_id_\d+>"
)


def read_tokenizer_json(tokenizer, eos_token_id, padding_pattern) -> dict:
    """`TokenVocabulary.from_tokenizer_json`'s arguments for `TokenVocabulary`."""
    try:
        from tokenizers import Tokenizer
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "Loading a tokenizer.json needs the `tokenizers` package "
            "(pip install 'static-keras[strings]')"
        ) from error
    name = None
    if not isinstance(tokenizer, Tokenizer):
        name = os.fspath(tokenizer)
        if not os.path.isfile(name):
            raise FileNotFoundError(f"No tokenizer.json at {name!r}")
        try:
            tokenizer = Tokenizer.from_file(name)
        except Exception as error:  # the tokenizers package raises bare Exceptions
            raise ValueError(
                f"{name!r} is not a Hugging Face tokenizer.json that the `tokenizers` "
                f"package can read: {error}"
            ) from None
    config = json.loads(tokenizer.to_str())
    model_type = (config.get("model") or {}).get("type")
    if model_type == "WordPiece":
        raise ValueError("WordPiece tokenizers (`##` continuations) are not supported")
    scheme = _hf_scheme(config)
    vocab = tokenizer.get_vocab(with_added_tokens=False)
    added = tokenizer.get_added_tokens_decoder()
    size = 1 + max(max(vocab.values(), default=-1), max(added, default=-1))
    tokens = [b""] * size
    special = np.ones(size, bool)  # ids missing from the file stay disallowed
    for text, token_id in vocab.items():
        tokens[token_id] = _decode_piece(text, scheme)
        special[token_id] = False
    is_added = np.zeros(size, bool)
    for token_id, token in added.items():
        tokens[token_id] = token.content.encode("utf-8")
        special[token_id] = bool(token.special)
        is_added[token_id] = True
    special |= _padding_rows(tokens, is_added & ~special, padding_pattern)
    if eos_token_id is None:
        by_text = {token.content: i for i, token in added.items() if token.special}
        for text in ("</s>", "<|endoftext|>", "<|im_end|>", "<|end_of_text|>", "<eos>"):
            if text in by_text:
                eos_token_id = by_text[text]
                break
    return dict(token_bytes=tokens, special=special, eos_token_id=eos_token_id, name=name)


def read_gguf(path, eos_token_id, padding_pattern) -> dict:
    """`TokenVocabulary.from_gguf`'s arguments for `TokenVocabulary`."""
    path = os.fspath(path)
    fields = read_gguf_metadata(path)
    model = fields.get("tokenizer.ggml.model")
    texts = fields.get("tokenizer.ggml.tokens")
    if not isinstance(model, bytes) or not isinstance(texts, list):
        raise ValueError(f"{path!r} holds no tokenizer (tokenizer.ggml.tokens)")
    model = model.decode()
    if model == "gpt2":
        scheme = "byte_level"
    elif model in ("llama", "t5"):
        scheme = "sentencepiece"
    else:
        raise ValueError(f"GGUF tokenizer model {model!r} is not supported (gpt2, llama, t5)")
    types = fields.get("tokenizer.ggml.token_type")
    if types is None:
        types = np.full(len(texts), GGUF_NORMAL)
    elif len(types) != len(texts):
        raise ValueError(f"{path!r}: {len(types)} token types for {len(texts)} tokens")
    tokens = []
    for raw, kind in zip(texts, types):
        text = raw.decode("utf-8", errors="surrogateescape")
        if kind == GGUF_BYTE:
            value = byte_fallback_value(text)
            tokens.append(bytes([value]) if value is not None else raw)
        elif kind == GGUF_NORMAL:
            tokens.append(_decode_piece(text, scheme))
        else:
            tokens.append(raw)
    types = np.asarray(types)
    special = np.isin(types, (GGUF_UNKNOWN, GGUF_CONTROL, GGUF_UNUSED))
    special |= _padding_rows(tokens, types == GGUF_USER_DEFINED, padding_pattern)
    if eos_token_id is None and "tokenizer.ggml.eos_token_id" in fields:
        eos_token_id = int(fields["tokenizer.ggml.eos_token_id"])
    return dict(token_bytes=tokens, special=special, eos_token_id=eos_token_id, name=path)


def read_tiktoken(path, special_tokens, eos_token_id) -> dict:
    """`TokenVocabulary.from_tiktoken`'s arguments for `TokenVocabulary`."""
    path = os.fspath(path)
    ranks = {}
    with open(path, "rb") as file:
        for number, line in enumerate(file, 1):
            line = line.strip()
            if not line:
                continue
            try:
                encoded, rank = line.split()
                ranks[int(rank)] = base64.b64decode(encoded, validate=True)
            except ValueError:
                raise ValueError(f"{path!r} line {number} is not `base64 rank`") from None
    special_tokens = dict(special_tokens or {})
    size = 1 + max(max(ranks, default=-1), max(special_tokens.values(), default=-1))
    tokens = [b""] * size
    special = np.ones(size, bool)
    for rank, token in ranks.items():
        tokens[rank] = token
        special[rank] = False
    for text, token_id in special_tokens.items():
        if token_id in ranks:
            raise ValueError(f"Special token {text!r} reuses rank {token_id} of the file")
        tokens[token_id] = text.encode("utf-8")
    if eos_token_id is None:
        eos_token_id = special_tokens.get("<|endoftext|>")
    return dict(token_bytes=tokens, special=special, eos_token_id=eos_token_id, name=path)


def _padding_rows(
    texts: Sequence[bytes], candidates: np.ndarray, pattern: str | None
) -> np.ndarray:
    """bool `[V]`: the candidate rows whose text matches `pattern` in full."""
    rows = np.zeros(len(texts), bool)
    if pattern is None:
        return rows
    try:
        regex = re.compile(pattern.encode("utf-8") if isinstance(pattern, str) else pattern)
    except (re.error, TypeError) as error:
        raise ValueError(f"`padding_pattern` is not a valid regex ({error}): {pattern!r}") from None
    for i in np.flatnonzero(candidates):
        rows[i] = regex.fullmatch(texts[i]) is not None
    return rows


def _decoder_types(node) -> list[str]:
    """Every `type` inside a tokenizer.json decoder / pre-tokenizer tree."""
    found = []
    if isinstance(node, dict):
        if "type" in node:
            found.append(node["type"])
            if node["type"] == "Replace" and SPIECE in json.dumps(node.get("pattern")):
                found.append("ReplaceSpiece")
        for value in node.values():
            found.extend(_decoder_types(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_decoder_types(value))
    return found


SPIECE = "\u2581"


def _hf_scheme(config: dict) -> str:
    types = set(_decoder_types(config.get("decoder"))) | set(
        _decoder_types(config.get("pre_tokenizer"))
    )
    if "ByteLevel" in types:
        return "byte_level"
    if types & {"Metaspace", "ByteFallback", "ReplaceSpiece"} or (config.get("model") or {}).get(
        "byte_fallback"
    ):
        return "sentencepiece"
    return "text"


def _decode_piece(text: str, scheme: str) -> bytes:
    if scheme == "byte_level":
        if is_byte_level(text):
            return decode_byte_level(text)
        return text.encode("utf-8")
    if scheme == "sentencepiece":
        return decode_sentencepiece(text)
    return text.encode("utf-8", errors="surrogateescape")
