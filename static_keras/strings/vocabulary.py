"""`TokenVocabulary`: token id -> bytes, with loaders for real tokenizer files.

A string constraint works on bytes: a token may emit half a UTF-8 character,
and two tokenizations of one string differ in where they cut it. This module
turns the usual tokenizer files into one list of token byte strings plus a
mask of the tokens that never appear in text (special, control, unknown and
unused tokens):

- a list of token byte strings (`from_token_bytes`);
- a Hugging Face `tokenizer.json` (`from_tokenizer_json`, needs the
  `tokenizers` package): byte-level BPE, SentencePiece with byte fallback,
  or plain text pieces; added tokens marked special are never allowed;
- a GGUF file (`from_gguf`, its metadata read by `gguf_metadata`, no
  dependency): `tokenizer.ggml.model` `gpt2` (byte-level BPE) or `llama`
  (SentencePiece); token types control, unknown and unused are never
  allowed;
- padding rows: GGUF user-defined tokens and `tokenizer.json` added tokens
  whose text is a padding or placeholder name (`PADDING_PATTERN`: Qwen2's
  290 `[PAD151646]` .. rows, `<pad>`, `<unused12>`, `<extra_id_3>`) are
  special by default, so no member is ever spelled with a padding row; pass
  `padding_pattern=None` to keep them as text, or another regex;
- a `.tiktoken` file (`from_tiktoken`): one `base64(bytes) rank` per line, no
  dependency; special tokens such as `<|endoftext|>` are given by the caller.

`TokenVocabulary.trie` (the vocabulary-side structure of the compiler) is
built on first use and kept, so compiling many string sets against one
vocabulary pays for it once.

NumPy and the standard library only (plus the optional loaders' packages).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from typing import Iterable
from typing import Sequence

import numpy as np

from static_keras.strings.byte_decoding import byte_fallback_value
from static_keras.strings.byte_decoding import decode_byte_level
from static_keras.strings.byte_decoding import decode_sentencepiece
from static_keras.strings.byte_decoding import is_byte_level
from static_keras.strings.gguf_metadata import read_gguf_metadata
from static_keras.strings.token_trie import TokenTrie

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


class TokenVocabulary:
    """The bytes of every token of a tokenizer, and which tokens are special.

    Args:
        token_bytes: sequence of `bytes`, one per token id `0 .. V-1`.
        special: optional bool array-like `[V]` or iterable of token ids:
            tokens that never appear in text (never allowed by a string
            constraint). Empty tokens are never allowed either. Defaults to
            none.
        eos_token_id: optional int, the tokenizer's end-of-sequence token
            (a default for `StringIndex.from_strings`).
        name: optional str describing where the vocabulary came from.

    Example:

    >>> vocab = TokenVocabulary.from_token_bytes([b"a", b"b", b"ab", b"</s>"],
    ...                                          special=[3], eos_token_id=3)
    >>> vocab.vocab_size, vocab.decode([2, 1, 3])
    (4, b'abb')
    """

    def __init__(
        self,
        token_bytes: Sequence[bytes],
        *,
        special=None,
        eos_token_id: int | None = None,
        name: str | None = None,
    ):
        tokens = list(token_bytes)
        if not tokens:
            raise ValueError("A vocabulary needs at least one token")
        for position, token in enumerate(tokens):
            if not isinstance(token, (bytes, bytearray)):
                raise ValueError(
                    f"Token {position} must be bytes. Received: {type(token).__name__} {token!r}"
                )
        self._tokens = [bytes(t) for t in tokens]
        size = len(self._tokens)
        mask = np.zeros(size, bool)
        if special is not None:
            special = np.asarray(list(special) if not hasattr(special, "__len__") else special)
            if special.dtype == bool:
                if special.shape != (size,):
                    raise ValueError(
                        f"`special` as a mask must have shape ({size},). Received {special.shape}"
                    )
                mask = special.copy()
            elif special.size:
                ids = special.astype(np.int64)
                if ids.min() < 0 or ids.max() >= size:
                    raise ValueError(f"`special` ids must lie in [0, {size})")
                mask[ids] = True
        self._special = mask
        if eos_token_id is not None and not 0 <= int(eos_token_id) < size:
            raise ValueError(
                f"`eos_token_id` must lie in [0, {size}). Received: eos_token_id={eos_token_id}"
            )
        self.eos_token_id = None if eos_token_id is None else int(eos_token_id)
        self.name = name
        self._trie: TokenTrie | None = None
        self._checksum: str | None = None

    # Constructors --------------------------------------------------------

    @classmethod
    def from_token_bytes(cls, token_bytes: Sequence[bytes], **kwargs) -> "TokenVocabulary":
        """A vocabulary from a list of token byte strings (see the class)."""
        return cls(token_bytes, **kwargs)

    @classmethod
    def load(cls, path: str | os.PathLike, **kwargs) -> "TokenVocabulary":
        """Loads `.gguf`, `.tiktoken` or `tokenizer.json` (`.json`) by suffix.

        Keyword arguments go to the loader (`eos_token_id`; `special_tokens`
        for `.tiktoken`; `padding_pattern` for `.gguf` and `.json`).
        """
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"No vocabulary file at {path!r}")
        if path.endswith(".gguf"):
            return cls.from_gguf(path, **kwargs)
        if path.endswith(".tiktoken"):
            return cls.from_tiktoken(path, **kwargs)
        if path.endswith(".json"):
            return cls.from_tokenizer_json(path, **kwargs)
        raise ValueError(
            f"Unknown vocabulary file {path!r}: expected .gguf, .tiktoken or tokenizer.json"
        )

    @classmethod
    def from_tokenizer_json(
        cls,
        tokenizer,
        *,
        eos_token_id: int | None = None,
        padding_pattern: str | None = PADDING_PATTERN,
    ):
        """A Hugging Face tokenizer (a `tokenizer.json` path or a `Tokenizer`).

        Token text is decoded with GPT-2's byte mapping when the tokenizer's
        decoder (or pre-tokenizer) is `ByteLevel`, as SentencePiece (`▁` and
        `<0xNN>`) when it uses `Metaspace`, `ByteFallback` or replaces `▁`,
        and as UTF-8 text otherwise. Added tokens marked special are never
        allowed; other added tokens are their UTF-8 text.

        Args:
            tokenizer: path of a `tokenizer.json`, or a `tokenizers.Tokenizer`.
            eos_token_id: optional int. Defaults to the id of the first added
                special token among `</s>`, `<|endoftext|>`, `<|im_end|>`,
                `<|end_of_text|>`, `<eos>`, if any.
            padding_pattern: regex (str) or None. Added tokens whose whole
                text matches are padding rows, never allowed (default
                `PADDING_PATTERN`; None keeps them as text).
        """
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
        return cls(tokens, special=special, eos_token_id=eos_token_id, name=name)

    @classmethod
    def from_gguf(
        cls,
        path: str | os.PathLike,
        *,
        eos_token_id: int | None = None,
        padding_pattern: str | None = PADDING_PATTERN,
    ):
        """The vocabulary of a GGUF file (its metadata only; see `gguf_metadata`).

        `tokenizer.ggml.model` `gpt2` is byte-level BPE, `llama` (and `t5`)
        SentencePiece with byte tokens (type 6, `<0xNN>`). Token types
        unknown (2), control (3) and unused (5) are never allowed;
        user-defined tokens (4) are their UTF-8 text, except padding rows
        (whole text matches `padding_pattern`; None keeps them as text).
        `eos_token_id` defaults to `tokenizer.ggml.eos_token_id`.
        """
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
        return cls(tokens, special=special, eos_token_id=eos_token_id, name=path)

    @classmethod
    def from_tiktoken(
        cls,
        path: str | os.PathLike,
        *,
        special_tokens: dict[str, int] | None = None,
        eos_token_id: int | None = None,
    ):
        """A `.tiktoken` file: `base64(token bytes) rank` per line.

        Args:
            path: the file.
            special_tokens: optional dict text -> id of special tokens (the
                file does not hold them; GPT-2's is `{"<|endoftext|>": 50256}`).
                They are never allowed in text.
            eos_token_id: optional int. Defaults to the id of
                `<|endoftext|>` when it is among `special_tokens`.
        """
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
        return cls(tokens, special=special, eos_token_id=eos_token_id, name=path)

    # Properties and queries ---------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    @property
    def token_bytes(self) -> list[bytes]:
        """The bytes of every token (special tokens: their text, never allowed)."""
        return list(self._tokens)

    @property
    def special(self) -> np.ndarray:
        """bool `[V]`: tokens that never appear in text."""
        view = self._special.view()
        view.flags.writeable = False
        return view

    @property
    def text_tokens(self) -> np.ndarray:
        """bool `[V]`: tokens a string constraint may allow (non-special, non-empty)."""
        lengths = np.fromiter(map(len, self._tokens), np.int64, self.vocab_size)
        return ~self._special & (lengths > 0)

    @property
    def trie(self) -> TokenTrie:
        """The vocabulary-side structure, built on first use and kept.

        EOS is excluded by `StringIndex.from_strings` per set, not here, so
        one trie serves every EOS choice.
        """
        if self._trie is None:
            self._trie = TokenTrie.build(self._tokens, ~self._special)
        return self._trie

    @property
    def checksum(self) -> str:
        """SHA-256 of the token bytes and special flags (what a saved index checks)."""
        if self._checksum is None:
            digest = hashlib.sha256()
            lengths = np.fromiter(map(len, self._tokens), np.int64, self.vocab_size)
            digest.update(lengths.tobytes())
            digest.update(b"".join(self._tokens))
            digest.update(np.packbits(self._special).tobytes())
            self._checksum = digest.hexdigest()
        return self._checksum

    def decode(self, token_ids: Iterable[int], *, skip_special: bool = True) -> bytes:
        """The bytes of a token sequence; negative ids (padding) are skipped,
        and so are special tokens (EOS included) unless `skip_special=False`."""
        out = []
        for token_id in token_ids:
            token_id = int(token_id)
            if token_id < 0:
                continue
            if token_id >= self.vocab_size:
                raise ValueError(f"Token id {token_id} is outside the vocabulary")
            if skip_special and self._special[token_id]:
                continue
            out.append(self._tokens[token_id])
        return b"".join(out)

    def __repr__(self) -> str:
        return (
            f"TokenVocabulary(vocab_size={self.vocab_size}, "
            f"special={int(self._special.sum())}, eos_token_id={self.eos_token_id}, "
            f"name={self.name!r})"
        )


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
