"""Peak memory of one static-keras string compile, in a fresh process.

`python -m benchmarks.strings.ours_memory JOB.json` loads the vocabulary
(an `.npz` of `peers.save_vocabulary`), builds its token trie, compiles a
few strings once (so the compiled loops are loaded), then resets the
kernel's resident-set high-water mark (`/proc/self/clear_refs`), compiles
the whole set and prints one JSON line: `peak_bytes`, the high-water mark
(`VmHWM`) minus the resident set before the compile (`VmRSS`). The caller
sets `MALLOC_MMAP_THRESHOLD_` so that glibc maps every large allocation
afresh and unmaps it on free: resident memory then follows live memory, and
this counts every array of the compile, including those of the compiled
loops, which `tracemalloc` cannot see. Linux only; elsewhere `peak_bytes` is
null.
"""

from __future__ import annotations

import json

from benchmarks.strings import peers
from static_keras.strings import StringIndex
from static_keras.strings import TokenVocabulary


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


def run(job: dict) -> dict:
    tokens, special, eos = peers.load_vocabulary(job["vocab"])
    vocab = TokenVocabulary.from_token_bytes(tokens, special=special, eos_token_id=eos)
    vocab.trie  # noqa: B018 - the vocabulary side is not part of a set's compile
    with open(job["strings"]) as file:
        strings = json.load(file)
    StringIndex.from_strings(strings[:10], vocab)  # loads the compiled loops
    try:
        with open("/proc/self/clear_refs", "w") as file:
            file.write("5")  # reset VmHWM to the current VmRSS
        before = _status_kib("VmRSS")
    except OSError:
        return {"peak_bytes": None}
    StringIndex.from_strings(strings, vocab)
    return {"peak_bytes": (_status_kib("VmHWM") - before) * 1024}


def main(argv=None) -> None:
    peers.main(argv, runner=run)


if __name__ == "__main__":
    main()
