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

The file formats are read in `strings/tokenizer_files.py`.
`TokenVocabulary.trie` (the vocabulary-side structure of the compiler) is
built on first use and kept, so compiling many string sets against one
vocabulary pays for it once.

NumPy and the standard library only (plus the optional loaders' packages).
"""

from __future__ import annotations

import hashlib
import os
from typing import Iterable
from typing import Sequence

import numpy as np

from static_keras.strings import tokenizer_files
from static_keras.strings.token_trie import TokenTrie
from static_keras.strings.tokenizer_files import PADDING_PATTERN

__all__ = ["PADDING_PATTERN", "TokenVocabulary"]


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
        return cls(**tokenizer_files.read_tokenizer_json(tokenizer, eos_token_id, padding_pattern))

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
        return cls(**tokenizer_files.read_gguf(path, eos_token_id, padding_pattern))

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
        return cls(**tokenizer_files.read_tiktoken(path, special_tokens, eos_token_id))

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


def vocabulary_and_eos(vocabulary, eos_token_id: int | None) -> tuple[TokenVocabulary, int]:
    """`(TokenVocabulary, eos_token_id)` from what `StringIndex.from_strings`
    takes: a vocabulary, a list of token bytes or a tokenizer file's path;
    the EOS id given, else the vocabulary's (ValueError when neither)."""
    if isinstance(vocabulary, (str, os.PathLike)):
        vocabulary = TokenVocabulary.load(vocabulary)
    elif isinstance(vocabulary, (list, tuple)):
        vocabulary = TokenVocabulary.from_token_bytes(vocabulary)
    elif not isinstance(vocabulary, TokenVocabulary):
        raise ValueError(
            "`vocabulary` must be a TokenVocabulary, a list of token bytes or the path "
            f"of a .gguf, .tiktoken or tokenizer.json file. Received: {vocabulary!r:.80}"
        )
    if eos_token_id is None:
        eos_token_id = vocabulary.eos_token_id
        if eos_token_id is None:
            raise ValueError(
                f"`eos_token_id` is required: the vocabulary"
                f"{f' {vocabulary.name!r}' if vocabulary.name else ''} does "
                "not name an end-of-sequence token. Pass `eos_token_id=` here, or give "
                "the vocabulary one (a .tiktoken file holds no special tokens: "
                "`TokenVocabulary.load(path, special_tokens={'<|endoftext|>': 50256})` "
                "for GPT-2's)"
            )
    return vocabulary, eos_token_id
