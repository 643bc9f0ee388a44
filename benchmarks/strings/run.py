"""Compile time, per-step mask time, memory and a differential check, side by side.

static-keras's trie automata (`StringIndex`) against XGrammar, llguidance and
outlines-core on real tokenizer vocabularies (Qwen2's 151,936 tokens and
GPT-2's 50,257 by default; any `.gguf`, `.tiktoken` or `tokenizer.json` via
`--vocab`), for string sets of K = 100 .. 100,000 strings.

    python -m benchmarks.strings.run            # the full run (tens of minutes)
    python -m benchmarks.strings.run --quick    # GPT-2 only, small K, a minute or two

Measured per vocabulary:
- one-time vocabulary preparation (ours: load + token trie; peers: their
  tokenizer info);
- compile time per K (median of `--repeats` after one warm-up compile for
  ours; peers run in a child process each, capped by `--peer-timeout` and
  reported "timed out" rather than waited for);
- memory: our device arrays and the peak memory of a compile (resident-set
  high-water mark in a fresh process, `ours_memory`),
  XGrammar's `memory_size_bytes`, the peers' RSS growth;
- per-step mask time at `--batch` rows: `--batches` batches of (decode path,
  position) pairs drawn from random decode paths through the set; ours fills
  the XGrammar/vLLM int32 bitmask `[batch, ceil(V/32)]` for the whole batch in
  one vectorised call, the peers fill it row by row (each call timed) and,
  for XGrammar, also with its batch API; per row = batch time / batch;
- differential check: our bitmask rows against each peer's, row by row.

Writes `strings_compile.csv`, `strings_mask.csv` and `strings_diff.csv` under
`--out-dir` (default `benchmarks/results`) and prints the tables.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from benchmarks.strings import peers as peer_jobs  # noqa: E402
from benchmarks.strings import protocol  # noqa: E402
from benchmarks.strings import string_sets  # noqa: E402
from static_keras.strings import StringIndex  # noqa: E402
from static_keras.strings import TokenVocabulary  # noqa: E402

VOCAB_DIR = os.path.join(os.path.dirname(REPO), "shared", "data", "vocab")
DEFAULT_VOCABS = ("ggml-vocab-qwen2.gguf", "ggml-vocab-gpt-2.gguf")
SPECIAL_TIKTOKEN = {"<|endoftext|>": 50256}  # GPT-2's, for gpt2.tiktoken


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", action="append", help="vocabulary file (repeatable)")
    parser.add_argument("--set", default="product_paths", choices=string_sets.NAMES)
    parser.add_argument("--ks", default="100,1000,10000,100000")
    parser.add_argument("--mask-ks", default="1000,10000")
    parser.add_argument(
        "--real-sets",
        default="botocore,unicode,pycountry",
        help="real sets compiled whole (comma list, '' for none)",
    )
    parser.add_argument("--peers", default="xgrammar,llguidance,outlines")
    parser.add_argument("--peer-timeout", type=float, default=420.0)
    parser.add_argument(
        "--peer-max-k",
        default="xgrammar=100000,llguidance=100000,outlines=10000",
        help="largest K each peer is asked to compile (peer=K,...)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--layer", action="store_true", help="also time the Keras layer (TF)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default=os.path.join(REPO, "benchmarks", "results"))
    parser.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "sk_strings"))
    args = parser.parse_args(argv)
    if args.quick:
        args.vocab = args.vocab or [os.path.join(VOCAB_DIR, "ggml-vocab-gpt-2.gguf")]
        args.ks, args.mask_ks, args.real_sets = "100,1000", "1000", "pycountry"
        args.peers = args.peers if args.peers != "xgrammar,llguidance,outlines" else "xgrammar"
        args.repeats, args.batches, args.peer_timeout = 2, 5, min(args.peer_timeout, 60)
    args.vocab = args.vocab or [os.path.join(VOCAB_DIR, name) for name in DEFAULT_VOCABS]
    args.ks = [int(k) for k in args.ks.split(",") if k]
    args.mask_ks = [int(k) for k in args.mask_ks.split(",") if k]
    args.real_sets = [s for s in args.real_sets.split(",") if s]
    args.peers = [p for p in args.peers.split(",") if p and _importable(p)]
    limits = dict(item.split("=") for item in args.peer_max_k.split(",") if item)
    args.peer_max_k = {peer: int(limits.get(peer, 10**9)) for peer in args.peers}
    return args


def _importable(peer: str) -> bool:
    module = {"xgrammar": "xgrammar", "llguidance": "llguidance", "outlines": "outlines_core"}
    try:
        __import__(module[peer])
        return True
    except Exception:  # noqa: BLE001 - any failure means "not available here"
        print(f"[skip] {peer}: not installed", file=sys.stderr)
        return False


def _versions() -> dict:
    out = {"python": platform.python_version(), "numpy": np.__version__}
    for name, module in (
        ("xgrammar", "xgrammar"),
        ("llguidance", "llguidance"),
        ("outlines-core", "outlines_core"),
        ("tokenizers", "tokenizers"),
        ("gguf", "gguf"),
        ("cython", "Cython"),
    ):
        try:
            from importlib.metadata import version

            out[name] = version(name)
        except Exception:  # noqa: BLE001
            out[name] = "absent"
    out["cpus"] = os.cpu_count()
    out["machine"] = platform.processor() or platform.machine()
    return out


def _load_vocabulary(path):
    start = time.perf_counter()
    kwargs = {"special_tokens": SPECIAL_TIKTOKEN} if path.endswith(".tiktoken") else {}
    vocab = TokenVocabulary.load(path, **kwargs)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    vocab.trie  # noqa: B018 - builds and caches the vocabulary side
    return vocab, load_s, time.perf_counter() - start


def _time_ours(strings, vocab, repeats):
    StringIndex.from_strings(strings, vocab)  # warm-up (allocator, caches)
    times = []
    index = None
    for _ in range(repeats):
        start = time.perf_counter()
        index = StringIndex.from_strings(strings, vocab)
        times.append(time.perf_counter() - start)
    return index, times


def _run_job(module, job, strings, cache_dir, *, timeout=None, env=None):
    """Runs `python -m module JOB.json` on `job` plus the strings (written to a
    file beside it); returns the finished process, or None on timeout."""
    tag = f"{job.get('peer', 'ours')}-{os.getpid()}-{time.monotonic_ns()}"
    strings_file = os.path.join(cache_dir, f"{tag}-strings.json")
    job_file = os.path.join(cache_dir, f"{tag}-job.json")
    with open(strings_file, "w") as file:
        json.dump(strings, file, ensure_ascii=False)
    with open(job_file, "w") as file:
        json.dump(dict(job, strings=strings_file), file)
    try:
        return subprocess.run(
            [sys.executable, "-m", module, job_file],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None
    finally:
        for name in (strings_file, job_file):
            os.unlink(name)


def _last_json(done) -> dict:
    return json.loads(done.stdout.strip().splitlines()[-1])


def _peak_ours(vocab_npz, strings, cache_dir) -> float:
    """Peak memory (bytes) of one compile, measured in a fresh process."""
    done = _run_job(
        "benchmarks.strings.ours_memory",
        {"vocab": vocab_npz},
        strings,
        cache_dir,
        # glibc: every allocation of 64 KiB or more gets its own mapping,
        # returned on free, so resident memory follows live memory.
        env=dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536"),
    )
    if done.returncode != 0:
        raise RuntimeError(f"ours_memory failed: {done.stderr.strip()[-500:]}")
    peak = _last_json(done)["peak_bytes"]
    return float("nan") if peak is None else float(peak)


def _run_peer(peer, vocab_npz, strings, repeats, timeout, cache_dir, paths=None):
    job = {"peer": peer, "vocab": vocab_npz, "repeats": repeats}
    if paths is not None:
        job["paths"] = paths
        job["masks_out"] = os.path.join(cache_dir, f"{peer}-{os.getpid()}-masks.npy")
    done = _run_job("benchmarks.strings.peers", job, strings, cache_dir, timeout=timeout)
    if done is None:
        return {"status": f"timed out (> {timeout:.0f} s)"}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"status": f"error: {last[:160]}"}
    result = _last_json(done)
    result["status"] = "ok"
    if paths is not None:
        result["masks"] = np.load(job["masks_out"])
        os.unlink(job["masks_out"])
    return result


def _sample_paths(index, count, rng):
    """Random decode paths (uniform over allowed tokens at each state), EOS last."""
    paths = []
    for _ in range(count):
        state, path = 0, []
        while not index.is_finished([state])[0]:
            _, tokens, targets = index.edges([state])
            pick = int(rng.integers(tokens.size))
            path.append(int(tokens[pick]))
            state = int(targets[pick])
        paths.append(path)
    width = max(map(len, paths))
    out = np.full((count, width), -1, np.int32)
    for i, path in enumerate(paths):
        out[i, : len(path)] = path
    return out, np.array([len(p) for p in paths])


def _mask_row(base, protocol_name, batch, engine, batch_ns, floor_median=None) -> dict:
    """One row of the mask table: µs per row (batch time / batch size)."""
    per_row = [t / batch / 1000 for t in batch_ns]
    median = statistics.median(per_row)
    return dict(
        base,
        protocol=protocol_name,
        batch=batch,
        engine=engine,
        per_row_us_median=median,
        per_row_us_p90=_percentile(per_row, 90),
        vs_floor=median / floor_median if floor_median else "",
        status="ok",
    )


def _percentile(values, q):
    return float(np.percentile(np.asarray(values, float), q)) if len(values) else float("nan")


def _mask_benchmark(
    args, vocab, vocab_npz, index, strings, k, rows_out, diff_out, label, failed=None
):
    rng = np.random.default_rng(args.seed)
    paths, lengths = _sample_paths(index, max(64, args.batch), rng)
    rows = rng.integers(0, paths.shape[0], (args.batches, args.batch))
    # A position before EOS: 0 .. len - 1 tokens consumed.
    prefix = (rng.random(rows.shape) * lengths[rows]).astype(np.int64)
    paths_file = os.path.join(args.cache_dir, f"paths-{os.getpid()}.npz")
    np.savez(paths_file, paths=paths, rows=rows, lengths=prefix)
    # Our states: walk each (path, position) prefix.
    states = np.zeros(rows.shape, np.int32)
    for b in range(args.batches):
        seqs = paths[rows[b]].copy()
        seqs[np.arange(seqs.shape[1])[None, :] >= prefix[b][:, None]] = -1
        states[b] = index.walk(seqs)
    assert (states >= 0).all()
    words = (vocab.vocab_size + 31) // 32
    # One bitmask buffer, reused every step as a decode loop does (the peers
    # fill a reused buffer too); timed under each protocol and batch size
    # against the floor, writing the same rows (benchmarks/strings/protocol.py).
    out = np.full((args.batch, words), -1, np.int32)
    ours_masks = np.zeros((rows.size, words), np.int32)
    for b in range(args.batches):  # the masks of the differential check
        index.fill_bitmask(states[b], ours_masks[b * args.batch : (b + 1) * args.batch])
    allowed_counts = np.unpackbits(ours_masks.view(np.uint8), axis=1).sum(axis=1)
    base = {
        "vocab": label,
        "set": args.set,
        "k": k,
        "batches": args.batches,
        "allowed_median": float(np.median(allowed_counts)),
        "allowed_p90": _percentile(allowed_counts, 90),
    }
    floors = {}
    for name in protocol.PROTOCOLS:
        for n in protocol.BATCH_SIZES:
            if n > args.batch:
                continue
            floor = protocol.floor_ns(out, n, args.batches, name)
            floors[name, n] = statistics.median(t / n / 1000 for t in floor)
            rows_out.append(_mask_row(base, name, n, "floor (write the rows)", floor))

            # Inputs sliced outside the timed region, as for the floor.
            batch_states = [np.ascontiguousarray(states[b, :n]) for b in range(args.batches)]
            rows_view = out[:n]

            def ours(b, batch_states=batch_states, rows_view=rows_view):
                index.fill_bitmask(batch_states[b], rows_view)

            times = protocol.time_batches(ours, args.batches, name)
            rows_out.append(_mask_row(base, name, n, "static-keras", times, floors[name, n]))
    if args.layer:
        rows_out.extend(_layer_benchmark(args, index, states, base))
    for peer in args.peers:
        if k > args.peer_max_k[peer]:
            continue
        if peer in (failed or {}):  # a compile that timed out would time out again here
            status = f"not run (compile: {failed[peer]})"
            rows_out.append(dict(base, engine=peer, status=status))
            diff_out.append(dict(base, engine=peer, status=status))
            continue
        result = _run_peer(
            peer, vocab_npz, strings, 1, args.peer_timeout, args.cache_dir, paths=paths_file
        )
        if result["status"] != "ok":
            rows_out.append(dict(base, engine=peer, status=result["status"]))
            diff_out.append(dict(base, engine=peer, status=result["status"]))
            continue
        for key, times in result["timings_ns"].items():
            name, n, how = key.split("|")
            engine = f"{peer} ({how})"
            rows_out.append(_mask_row(base, name, int(n), engine, times, floors[name, int(n)]))
        theirs = result["masks"]
        differ = np.flatnonzero((theirs != ours_masks).any(axis=1))
        examples = []
        for r in differ[:3]:
            b, i = divmod(int(r), args.batch)
            ours_bits = np.unpackbits(ours_masks[r].view(np.uint8), bitorder="little")
            their_bits = np.unpackbits(theirs[r].view(np.uint8), bitorder="little")
            only_ours = np.flatnonzero(ours_bits & ~their_bits)[:5].tolist()
            only_theirs = np.flatnonzero(their_bits & ~ours_bits)[:5].tolist()
            text = vocab.decode(paths[rows[b, i], : prefix[b, i]]).decode("utf-8", "replace")
            examples.append(f"after {text!r}: only ours {only_ours}, only {peer} {only_theirs}")
        diff_out.append(
            dict(
                base,
                engine=peer,
                states=int(rows.size),
                mismatched_rows=int(differ.size),
                examples=" | ".join(examples),
                status="ok",
            )
        )
    os.unlink(paths_file)


def _layer_benchmark(args, index, states, base):
    import tensorflow as tf

    from static_keras.layers import constraint_for

    layer = constraint_for(index)
    logits = tf.random.normal((args.batch, index.vocab_size))

    @tf.function
    def mask(lg, st):
        return layer.mask_logits(lg, st)

    @tf.function
    def advance(st, tk):
        return layer.advance(st, tk)

    rows = []
    for name, fn in (
        ("mask_logits [R, V] float32", lambda s: mask(logits, s)),
        ("advance [R]", lambda s: advance(s, tf.zeros_like(s))),
    ):
        inputs = [tf.constant(states[b]) for b in range(args.batches)]
        times = protocol.time_batches(
            lambda b, fn=fn: np.asarray(fn(inputs[b])), args.batches, "back to back"
        )
        engine = f"static-keras Keras layer, TF CPU: {name}"
        rows.append(_mask_row(base, "back to back", args.batch, engine, times))
    return rows


def _write(path, rows):
    if not rows:
        return
    fields = []
    for row in rows:
        fields.extend(f for f in row if f not in fields)
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()}
            )


def _table(rows, columns):
    if not rows:
        return ""
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    for row in rows:
        cells = []
        for c, w in zip(columns, widths):
            value = row.get(c, "")
            value = f"{value:.4g}" if isinstance(value, float) else str(value)
            cells.append(value.ljust(w))
        lines.append("  ".join(cells))
    return "\n".join(lines)


_MASK_COLUMNS = [
    "vocab",
    "k",
    "protocol",
    "batch",
    "engine",
    "per_row_us_median",
    "per_row_us_p90",
    "vs_floor",
    "allowed_median",
    "status",
]


def main(argv=None):
    args = _parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    os.makedirs(args.cache_dir, exist_ok=True)
    versions = _versions()
    print("versions:", json.dumps(versions))
    compile_rows, mask_rows, diff_rows = [], [], []
    for vocab_path in args.vocab:
        label = os.path.basename(vocab_path)
        vocab, load_s, trie_s = _load_vocabulary(vocab_path)
        print(
            f"\n{label}: V={vocab.vocab_size}, load {load_s:.2f} s, "
            f"token trie {trie_s * 1000:.0f} ms ({vocab.trie.nbytes / 2**20:.1f} MiB), "
            f"eos={vocab.eos_token_id}"
        )
        vocab_npz = os.path.join(args.cache_dir, f"{label}.npz")
        peer_jobs.save_vocabulary(vocab_npz, vocab.token_bytes, vocab.special, vocab.eos_token_id)
        cases = [(args.set, k) for k in args.ks]
        for name in args.real_sets:
            cases.append((name, string_sets.size(name)))
        for set_name, k in cases:
            strings = string_sets.load(set_name, k, args.seed)
            k = len(strings)
            mean_chars = sum(map(len, strings)) / k
            repeats = args.repeats if k <= 10000 else max(1, args.repeats // 2)
            index, times = _time_ours(strings, vocab, repeats)
            peak = _peak_ours(vocab_npz, strings, args.cache_dir)
            base = {
                "vocab": label,
                "vocab_size": vocab.vocab_size,
                "set": set_name,
                "k": k,
                "mean_chars": round(mean_chars, 1),
            }
            compile_rows.append(
                dict(
                    base,
                    engine="static-keras",
                    compile_ms_median=statistics.median(times) * 1000,
                    compile_ms_min=min(times) * 1000,
                    runs=len(times),
                    vocab_prep_ms=trie_s * 1000,
                    index_mib=index.nbytes / 2**20,
                    peak_mib=peak / 2**20,
                    max_length=index.length,
                    states=index.num_states,
                    status="ok",
                )
            )
            print(
                _table(
                    compile_rows[-1:],
                    ["set", "k", "engine", "compile_ms_median", "index_mib", "peak_mib"],
                )
            )
            failed = {}
            for peer in args.peers:
                if k > args.peer_max_k[peer]:
                    compile_rows.append(
                        dict(base, engine=peer, status=f"not run (K > {args.peer_max_k[peer]})")
                    )
                    continue
                peer_repeats = 3 if k <= 1000 and peer != "outlines" else 1
                result = _run_peer(
                    peer, vocab_npz, strings, peer_repeats, args.peer_timeout, args.cache_dir
                )
                row = dict(base, engine=peer, status=result["status"])
                if result["status"] != "ok":
                    failed[peer] = result["status"]
                else:
                    row.update(
                        compile_ms_median=statistics.median(result["compile_s"]) * 1000,
                        compile_ms_min=min(result["compile_s"]) * 1000,
                        runs=len(result["compile_s"]),
                        vocab_prep_ms=result["vocab_prep_s"] * 1000,
                        first_mask_ms=result["first_mask_s"] * 1000,
                        peer_memory_mib=(
                            result["memory_bytes"] / 2**20 if result["memory_bytes"] >= 0 else ""
                        ),
                        rss_growth_mib=result["rss_growth_mb"],
                    )
                compile_rows.append(row)
                print(
                    _table(
                        [row],
                        ["set", "k", "engine", "compile_ms_median", "peer_memory_mib", "status"],
                    )
                )
            if set_name == args.set and k in args.mask_ks:
                first = len(mask_rows)
                _mask_benchmark(
                    args, vocab, vocab_npz, index, strings, k, mask_rows, diff_rows, label, failed
                )
                print(_table(mask_rows[first:], _MASK_COLUMNS[1:]))
            _write(os.path.join(args.out_dir, "strings_compile.csv"), compile_rows)
            _write(os.path.join(args.out_dir, "strings_mask.csv"), mask_rows)
            _write(os.path.join(args.out_dir, "strings_diff.csv"), diff_rows)
    print("\nCompile (ms)")
    print(
        _table(
            compile_rows,
            [
                "vocab",
                "set",
                "k",
                "engine",
                "compile_ms_median",
                "compile_ms_min",
                "first_mask_ms",
                "index_mib",
                "peak_mib",
                "peer_memory_mib",
                "status",
            ],
        )
    )
    print("\nPer-step mask, per row (us)")
    print(_table(mask_rows, _MASK_COLUMNS))
    print("\nDifferential check")
    print(
        _table(
            diff_rows, ["vocab", "k", "engine", "states", "mismatched_rows", "examples", "status"]
        )
    )
    with open(os.path.join(args.out_dir, "strings_versions.csv"), "w") as file:
        file.write("name,value\n" + "".join(f"{k},{v}\n" for k, v in versions.items()))


if __name__ == "__main__":
    main()
