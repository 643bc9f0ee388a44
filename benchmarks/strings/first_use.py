"""The first string compile after a fresh install, in a new virtualenv.

    python -m benchmarks.strings.first_use [--vocab PATH] [--k 10000]

Makes a new virtualenv, installs NumPy and this checkout (`pip install
--no-deps`, which compiles the string compiler's C extension: its time is
reported apart), then, in a new process of that venv, times what a user's
first compile pays: importing `static_keras.strings`, loading the
vocabulary (GGUF metadata), the first `StringIndex.from_strings` on K
product paths (vocabulary trie + compile), a second compile, and the first
`fill_bitmask`. Also records which deep-learning packages the process
imported (none should be). Writes `strings_first_use.csv`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.strings import run as strings_run  # noqa: E402
from benchmarks.strings import string_sets  # noqa: E402

_PROBE = """
import json, sys, time
start = time.perf_counter()
from static_keras.strings import StringIndex, TokenVocabulary
imported = time.perf_counter()
vocab = TokenVocabulary.load(sys.argv[1])
loaded = time.perf_counter()
with open(sys.argv[2]) as file:
    strings = json.load(file)
index = StringIndex.from_strings(strings, vocab)
first = time.perf_counter()
StringIndex.from_strings(strings, vocab)
second = time.perf_counter()
import numpy as np
index.fill_bitmask(np.zeros(1, np.int32))
mask = time.perf_counter()
backends = sorted({"keras", "tensorflow", "jax", "torch", "numba"} & set(sys.modules))
print(json.dumps({
    "import_s": imported - start,
    "vocab_load_s": loaded - imported,
    "first_from_strings_s": first - loaded,
    "second_from_strings_s": second - first,
    "first_fill_bitmask_s": mask - second,
    "backends_imported": " ".join(backends) or "none",
}))
"""


def _run(command, **kwargs):
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return done


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--vocab", default=os.path.join(strings_run.VOCAB_DIR, strings_run.DEFAULT_VOCABS[0])
    )
    parser.add_argument("--k", type=int, default=10_000)
    parser.add_argument("--out-dir", default=os.path.join(REPO, "benchmarks", "results"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sk-first-use-") as work:
        venv = os.path.join(work, "venv")
        python = os.path.join(venv, "bin", "python")
        _run([sys.executable, "-m", "venv", venv])
        _run([python, "-m", "pip", "install", "--quiet", "numpy"])
        start = time.perf_counter()
        _run([python, "-m", "pip", "install", "--quiet", "--no-deps", REPO])
        install_s = time.perf_counter() - start
        strings_file = os.path.join(work, "strings.json")
        with open(strings_file, "w") as file:
            json.dump(string_sets.product_paths(args.k, seed=0), file)
        # A directory outside the checkout, so the installed package is used.
        done = _run([python, "-c", _PROBE, args.vocab, strings_file], cwd=work)
    row = dict(
        vocab=os.path.basename(args.vocab),
        k=args.k,
        install_s=install_s,
        **json.loads(done.stdout.strip().splitlines()[-1]),
    )
    os.makedirs(args.out_dir, exist_ok=True)
    strings_run._write(os.path.join(args.out_dir, "strings_first_use.csv"), [row])
    print(strings_run._table([row], list(row)))


if __name__ == "__main__":
    main()
