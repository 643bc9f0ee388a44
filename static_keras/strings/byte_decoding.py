"""Token strings to token bytes: GPT-2 byte-level BPE and SentencePiece.

Tokenizer files store tokens as text. Two encodings cover the tokenizers of
current LLMs:

- Byte-level BPE (GPT-2, Llama 3, Qwen2): every byte is shown as one printable
  character (GPT-2's `bytes_to_unicode` table: printable Latin-1 bytes stand
  for themselves, the other 68 bytes for U+0100 onwards), so a token's text
  maps back to its bytes character by character. Bytes that are not valid
  UTF-8 on their own (half a CJK character, part of an emoji) are tokens too.
- SentencePiece (Llama 2, Gemma, T5): `U+2581` ("▁") stands for a space, and
  with byte fallback a piece `<0xNN>` stands for the single byte `NN`.

NumPy and the standard library only.
"""

from __future__ import annotations

import functools
import re

#: SentencePiece's stand-in for a space.
SPIECE_SPACE = "\u2581"
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> character table (`bytes_to_unicode` in its encoder.py).

    Example:

    >>> table = bytes_to_unicode()
    >>> table[ord("a")], table[ord(" ")], table[0]
    ('a', 'Ġ', 'Ā')
    """
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@functools.lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    """The inverse of `bytes_to_unicode`: character -> byte."""
    return {char: byte for byte, char in bytes_to_unicode().items()}


def decode_byte_level(token: str) -> bytes:
    """The bytes of a byte-level BPE token (GPT-2 mapping).

    Raises:
        ValueError: when `token` holds a character outside the mapping (the
            token is not byte-level text; added tokens are stored raw).

    Example:

    >>> decode_byte_level("Ġhello"), decode_byte_level("ä¸Ń")
    (b' hello', b'\\xe4\\xb8\\xad')
    """
    table = unicode_to_bytes()
    try:
        return bytes(table[char] for char in token)
    except KeyError as error:
        raise ValueError(
            f"Token {token!r} is not byte-level BPE text: {error.args[0]!r} has no byte"
        ) from None


def is_byte_level(token: str) -> bool:
    """Whether every character of `token` is in GPT-2's byte mapping."""
    table = unicode_to_bytes()
    return all(char in table for char in token)


def byte_fallback_value(piece: str) -> int | None:
    """The byte of a SentencePiece byte-fallback piece `<0xNN>`, else None."""
    match = _BYTE_PIECE.fullmatch(piece)
    return int(match.group(1), 16) if match else None


def decode_sentencepiece(piece: str) -> bytes:
    """The bytes of a SentencePiece piece: `▁` is a space, `<0xNN>` one byte.

    Example:

    >>> decode_sentencepiece("▁the"), decode_sentencepiece("<0xE4>")
    (b' the', b'\\xe4')
    """
    value = byte_fallback_value(piece)
    if value is not None:
        return bytes([value])
    return piece.replace(SPIECE_SPACE, " ").encode("utf-8")
