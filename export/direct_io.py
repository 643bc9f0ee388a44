"""Large sequential writes and read-backs that skip the page cache.

A job writes a version's changed tensors once (about 1 GB at 2 x 10^7 items)
and reads them back once against their checksums; nothing in the job reads
them again. Through the page cache the kernel first finds a GB of fresh
cache pages and then throttles the writer while they are written back: on
the 2-core benchmark machine a 1 GiB buffered write took 3.8-5.6 s, the same
bytes with `O_DIRECT` 0.36-0.52 s (docs/benchmarks.md, "Catalogue deltas").
`O_DIRECT` moves the bytes between one reused page-aligned buffer and the
disk. Where a filesystem refuses it (tmpfs, some network filesystems) the
same calls go through the page cache: slower, never different bytes.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

#: Direct I/O moves whole blocks at block-aligned offsets (4 KiB covers the
#: logical block size of every Linux block device in use).
_BLOCK = 4096
#: The reused buffer: large enough that a syscall's cost is noise.
_BUFFER_BYTES = 1 << 24


def _open(path: str, flags: int) -> tuple[int, bool]:
    """`(fd, direct)`: `path` opened with O_DIRECT where the filesystem takes it."""
    direct = getattr(os, "O_DIRECT", 0)
    if direct:
        try:
            return os.open(path, flags | direct), True
        except OSError:  # EINVAL: a filesystem without direct I/O
            pass
    return os.open(path, flags), False


class SequentialWriter:
    """Writes a new file front to back: `write(array)` appends an array's
    bytes, `close()` pads the last block and truncates to the true size."""

    def __init__(self, path: str):
        self._fd, self.direct = _open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self._buffer = mmap.mmap(-1, _BUFFER_BYTES)  # anonymous: page aligned
        self._bytes = np.frombuffer(self._buffer, np.uint8)
        self._filled = 0
        self.size = 0

    def write(self, data: bytes) -> None:
        """Appends `data` (bytes or another contiguous buffer)."""
        data = np.frombuffer(data, np.uint8)
        done = 0
        while done < data.size:
            take = min(data.size - done, _BUFFER_BYTES - self._filled)
            self._bytes[self._filled : self._filled + take] = data[done : done + take]
            self._filled += take
            done += take
            if self._filled == _BUFFER_BYTES:
                self._flush(_BUFFER_BYTES)
        self.size += data.size

    def close(self) -> None:
        try:
            if self._filled:
                # Direct writes are whole blocks: pad, then cut the file back.
                padded = -(-self._filled // _BLOCK) * _BLOCK if self.direct else self._filled
                self._bytes[self._filled : padded] = 0
                self._flush(padded)
                os.ftruncate(self._fd, self.size)
        finally:
            os.close(self._fd)
            self._bytes = self._buffer = None  # unmapped once no view holds it

    def _flush(self, count: int) -> None:
        view = memoryview(self._buffer)[:count]
        written = 0
        while written < count:
            written += os.write(self._fd, view[written:])
        self._filled = 0

    def __enter__(self) -> "SequentialWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_chunks(path: str, offset: int, size: int):
    """Yields the bytes `[offset, offset + size)` of `path` as read-only
    memoryviews (valid until the next one), read from the disk where the
    filesystem allows it, not from the page cache. Stops early at the end
    of the file (the caller sees the short count)."""
    fd, direct = _open(path, os.O_RDONLY)
    buffer = mmap.mmap(-1, _BUFFER_BYTES)
    try:
        start = offset - offset % _BLOCK if direct else offset
        skip = offset - start
        left = size
        while left > 0:
            got = os.preadv(fd, [buffer], start)
            if got <= skip:
                return
            take = min(got - skip, left)
            yield memoryview(buffer)[skip : skip + take].toreadonly()
            left -= take
            start += got
            skip = 0
    finally:
        os.close(fd)  # the buffer is unmapped once the last view is dropped
