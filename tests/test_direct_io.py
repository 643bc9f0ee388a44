"""Writes and read-backs that skip the page cache (export/direct_io.py):
the same bytes as a plain file, on a disk that takes O_DIRECT and on one
that refuses it (tmpfs), at sizes and offsets that cross the buffer and
block boundaries."""

import os

import numpy as np
import pytest

from static_keras.export import direct_io

_BUFFER = direct_io._BUFFER_BYTES
_SIZES = [0, 1, 4095, 4096, 4097, _BUFFER - 1, _BUFFER, _BUFFER + 4097, 2 * _BUFFER + 3]


def _folders(tmp_path):
    folders = [str(tmp_path)]
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        folders.append("/dev/shm")  # tmpfs: no O_DIRECT, the buffered path
    return folders


def _write(path, pieces):
    with direct_io.SequentialWriter(path) as writer:
        for piece in pieces:
            writer.write(piece)
    return writer


@pytest.mark.parametrize("size", _SIZES)
def test_written_bytes_equal_the_input(tmp_path, size):
    rng = np.random.default_rng(size)
    data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    # Pieces of uneven sizes, bytes and arrays.
    cuts = np.sort(rng.integers(0, size + 1, 5))
    pieces = [data[a:b] for a, b in zip(np.r_[0, cuts], np.r_[cuts, size])]
    pieces[0] = np.frombuffer(pieces[0], np.uint8)
    for folder in _folders(tmp_path):
        path = os.path.join(folder, f"direct_io_test_{size}")
        try:
            writer = _write(path, pieces)
            assert writer.size == size
            with open(path, "rb") as file:
                assert file.read() == data  # exact length: the padding cut off
        finally:
            os.remove(path)


def test_read_chunks_returns_any_range(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 2 * _BUFFER + 12345, dtype=np.uint8).tobytes()
    for folder in _folders(tmp_path):
        path = os.path.join(folder, "direct_io_ranges")
        try:
            _write(path, [data])
            for offset, size in [(0, len(data)), (1, 10), (4095, 4098), (_BUFFER - 7, _BUFFER),
                                 (len(data) - 5, 5), (12345, 0)]:  # fmt: skip
                got = b"".join(bytes(c) for c in direct_io.read_chunks(path, offset, size))
                assert got == data[offset : offset + size]
                # Chunks are read-only views.
                for chunk in direct_io.read_chunks(path, offset, size):
                    assert chunk.readonly
                    break
            # Past the end: short, never padding.
            got = b"".join(bytes(c) for c in direct_io.read_chunks(path, len(data) - 3, 100))
            assert got == data[-3:]
        finally:
            os.remove(path)


def test_a_writer_replaces_an_existing_file(tmp_path):
    path = str(tmp_path / "replaced")
    _write(path, [b"x" * 10000])
    _write(path, [b"y" * 10])
    with open(path, "rb") as file:
        assert file.read() == b"y" * 10
