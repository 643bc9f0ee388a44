"""Whole 8-step decodes side by side with the reference STATIC implementation.

    python -m benchmarks.decoding.versus_reference --peer ../shared/peers/static-constraint-decoding
        [--backend jax|tensorflow] [--sizes 1e5,1e6,1e7] [--rounds 15] [--ours-only]

The reference code (youtube/static-constraint-decoding, JAX) is a peer taken
from the path given on the command line: never a dependency, never run in
CI. Both sides decode the same random semantic IDs (L = 8, V = 2048, d = 2,
sorted, as its builder expects) with the same logits: a fixed random table
indexed by a hash of (step, last token, batch row): the model is one table
row read per beam and step, the same for both sides (cold after the
eviction below: about 0.1 ms a step at 140 rows), and the rest is the
decode loop. Each configuration
runs interleaved rounds (the reference and each of our modes, in an order
that turns by one each round) in one process;
the table reports the median over rounds of the per-round ratio ours /
reference (lower is better) and both medians in ms.

Modes, per `--backend` (one process each, `KERAS_BACKEND` set here):
- jax: ours under `jax.jit`;
- tensorflow: ours under `tf.function(jit_compile=True)` (XLA) and
  `tf.function` without XLA (graph mode, what TF Serving runs by default).

Each mode also times its floor: the same search, logits, candidate widths
and top-k with no index read at all (`_NoIndex`); what a constrained decode
adds to it is the index's cost, and the floor's ratio to the reference
bounds what any constraint kernel can reach in that mode.

Both sides get their arguments ready-made: the index arrays and the logits
table live on the device before timing, and the reference's PRNG key (which
its harness passes through, unused by the table model) is one array made
once. (Until session 12 the key was a fresh `jnp.int32(0)` per call: a
host-to-device transfer inside the reference's timed call, about 0.1-0.5 ms
after the eviction, which flattered every ratio, most at 1 x 1.)

Configurations: "2x70 tpb30" (batch 2 x beam 70, 30 tokens per beam at
dense steps: the reference's own benchmark), "2x70 exact" (70 per beam),
"128x20", "1x1". Before timing, every configuration checks that our tokens equal
the reference's (the same set, logits and rule give the same beams).
Protocol: by default ("serving loop") 64 MiB of scratch memory is written
before every timed call, for every engine alike, so caches are as cold as
after a model's forward pass; `--protocol "back to back"` is the kindest
case. Writes `versus_reference_<backend>.csv` under `--out-dir`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from benchmarks.decoding.common import write_csv
from benchmarks.strings.protocol import PROTOCOLS
from benchmarks.strings.protocol import evict

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LENGTH, VOCAB, DENSE = 8, 2048, 2
TABLE_ROWS = 4099  # prime: the hash below spreads over every row
CONFIGS = (  # (name, batch, beam, tokens per beam at dense steps)
    ("2x70 tpb30", 2, 70, 30),
    ("2x70 exact", 2, 70, 70),
    ("128x20", 128, 20, 20),
    ("1x1", 1, 1, 1),
)


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", help="path of static-constraint-decoding")
    parser.add_argument("--backend", default="jax", choices=("jax", "tensorflow"))
    parser.add_argument("--sizes", default="1e5,1e6,1e7")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--configs", default=",".join(c[0] for c in CONFIGS))
    parser.add_argument(
        "--protocol",
        default="serving loop",
        choices=PROTOCOLS,
        help="'serving loop' writes 64 MiB of scratch memory before every timed call "
        "(caches cold, as after a model's forward pass); 'back to back' does not",
    )
    parser.add_argument(
        "--ours-only",
        action="store_true",
        help="time our modes and floors without the reference (where it does not fit in "
        "memory: about 0.44 GB per 10^6 items for its build)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default=os.path.join(REPO, "benchmarks", "results"))
    args = parser.parse_args(argv)
    if not (args.peer or args.ours_only):
        parser.error("--peer is required (or --ours-only)")
    return args


def _sorted_ids(n: int, seed: int):
    import numpy as np

    ids = np.random.default_rng(seed).integers(0, VOCAB, (n, LENGTH), dtype=np.int32)
    ids = np.unique(ids, axis=0)  # sorted, distinct: the reference builder's input
    return ids


def _reference(peer, ids, table, batch, beam, per_beam):
    """A jitted call of the reference decode with our logits table."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, os.path.abspath(peer))
    from static_decoding import decoding_jax
    from static_decoding.csr_utils import build_static_index

    packed, indptr, widths, start_mask, dense_mask, dense_states = build_static_index(
        ids, VOCAB, DENSE
    )
    arrays = [jnp.asarray(a) for a in (packed, indptr, start_mask, dense_mask, dense_states)]
    table = jnp.asarray(table)

    class TableModel:
        """Logits of (step, last token, batch row); the reference passes `key`
        through, so it carries the step."""

        def __call__(self, input_ids, key):
            rows = input_ids.shape[0]
            batch_row = jnp.arange(rows, dtype=jnp.int32) // max(1, rows // batch)
            code = _hash(jnp, key, input_ids[:, 0].astype(jnp.int32), batch_row)
            return jnp.take(table, code, axis=0)[:, None, :], key + 1

        def __hash__(self):
            return id(self)

    model = TableModel()
    key = jnp.int32(0)  # made once: a fresh scalar costs a host-to-device call per decode

    def run():
        out = decoding_jax.sparse_transition_jax(
            model, key, batch, beam, per_beam, 0, LENGTH, VOCAB, widths,
            *arrays, d_dense=DENSE,
        )  # fmt: skip
        return jax.block_until_ready(out)

    return run


def _hash(xp, step, last_token, batch_row):
    return (step * 7919 + last_token * 31 + batch_row * 104729) % TABLE_ROWS


class _NoIndex:
    """The floor: the same search with the same candidate widths and no index
    read. At a dense step the whole vocabulary (ranked at once where no
    per-beam cap binds, else its best `dense_top_k` per beam); at a CSR step, and
    at a dense step the layer reads as CSR rows (`dense_edge_rows`), `B_t`
    tokens a row, made up from the row and slot numbers, with their scores
    (their best `dense_top_k` where it caps); every state stays 0. What is left
    is the model, the log-softmax, the top-k and the beam bookkeeping."""

    def __init__(self, layer):
        from static_keras.constraint import dense_edge_rows
        from static_keras.constraint.decoding_constraint import DecodingConstraint

        self.constraint = type("NoIndex", (DecodingConstraint,), {})()
        self.constraint.length = layer.length
        self.constraint.candidates = self.candidates
        self.constraint.propose = self.propose
        self.constraint.advance = self.advance
        self.widths = layer.step_widths
        self.dense_levels = layer.dense_levels
        rows = dense_edge_rows.POINTERS in layer.derived_index_weights
        self.edge_row_step = layer.dense_levels - 1 if rows else None

    def _whole(self, step):
        return step < self.dense_levels and step != self.edge_row_step

    def propose(self, log_probs, states, step, dense_top_k, *, eligibility=None,
                need_next_states=False, rank_rows=False):  # fmt: skip
        from static_keras.constraint.decoding_constraint import StepProposal

        if (dense_top_k is None or rank_rows) and self._whole(step):  # the whole vocabulary
            return StepProposal(log_probs, needs_cap=dense_top_k is not None)
        return StepProposal(*self.candidates(log_probs, states, step, dense_top_k=dense_top_k))

    def advance(self, states, tokens, step):
        from keras import ops

        return ops.zeros_like(tokens)

    def candidates(self, log_probs, states, step, dense_top_k=None):
        import numpy as np
        from keras import ops

        from static_keras.kernels import gather

        rows = ops.shape(log_probs)[0]
        width = self.widths[step]
        if self._whole(step):
            scores, tokens = ops.top_k(log_probs, dense_top_k or width)
            tokens = ops.cast(tokens, "int32")
        else:
            # `B_t` distinct tokens per row, scattered over the vocabulary and
            # different in every row, as a real index's are: the model then
            # reads as many distinct (cold) table rows as a real decode. With
            # one token list for all rows (the floor until session 13) the
            # beams shared a few last tokens, the model's table rows stayed
            # in cache, and the floor read about 0.5 ms low at 2 x 70.
            slots = np.arange(width)[None, :]
            row = np.arange(rows)[:, None]
            tokens = (slots * 131 + row * 61 + step * 17) % VOCAB  # 131: odd, so distinct
            tokens = ops.convert_to_tensor(tokens.astype(np.int32))  # a constant
            scores = gather.take_along_rows(log_probs, tokens)
            if dense_top_k is not None and dense_top_k < width and step < self.dense_levels:
                scores, pick = ops.top_k(scores, dense_top_k)
                tokens = gather.take_along_rows(tokens, ops.cast(pick, "int32"))
        return scores, tokens, ops.zeros_like(tokens)


def _ours(layer, table, batch, beam, per_beam, backend, floor=False, eligibility=None):
    """`{mode: call}` of our decode with the same logits (`layer`: the
    `ConstrainedDecoding` holding the index, built once); `floor=True`: the
    same search through `_NoIndex` (no index read); `eligibility`: passed to
    `beam_search` (`benchmarks/decoding/eligibility_step.py`)."""
    from keras import ops

    from static_keras import beam_search

    def decode(table_tensor):
        def step_fn(prefix, state):
            rows = ops.shape(prefix)[0]
            t = ops.shape(prefix)[1]
            last = prefix[:, -1] if t else ops.zeros((rows,), "int32")
            # B rows at step 0, B x beam after it: the reference model's rule.
            batch_row = ops.arange(rows, dtype="int32") // ops.maximum(1, rows // batch)
            code = _hash(ops, t, last, batch_row)
            return ops.take(table_tensor, code, axis=0), state

        constraint = _NoIndex(layer).constraint if floor else layer
        return beam_search(
            constraint, step_fn, batch, beam, dense_top_k=per_beam, eligibility=eligibility
        )["tokens"]

    if backend == "jax":
        import jax
        import keras

        variables = [] if floor else layer.non_trainable_variables

        def stateless(values, table_tensor):
            # The index arrays are arguments, not constants folded into the program.
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return decode(table_tensor)

        jitted = jax.jit(stateless)
        values = [v.value for v in variables]
        table = jax.numpy.asarray(table)
        return {"JAX jit": lambda: jax.block_until_ready(jitted(values, table))}
    import tensorflow as tf

    variable = tf.Variable(table, trainable=False)
    xla = tf.function(lambda: decode(variable), jit_compile=True)
    graph = tf.function(lambda: decode(variable), jit_compile=False)
    return {"TF jit_compile": lambda: xla().numpy(), "TF graph, no XLA": lambda: graph().numpy()}


def main(argv=None):
    args = _parse(argv)
    os.environ["KERAS_BACKEND"] = args.backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    import numpy as np

    from static_keras import ConstrainedDecoding
    from static_keras import StaticIndex

    wanted = set(args.configs.split(","))
    table = np.random.default_rng(args.seed).normal(size=(TABLE_ROWS, VOCAB)).astype("float32")
    rows = []
    for size in [int(float(s)) for s in args.sizes.split(",")]:
        ids = _sorted_ids(size, args.seed)
        layer = ConstrainedDecoding(StaticIndex.build(ids, VOCAB, dense_levels=DENSE))
        for name, batch, beam, per_beam in CONFIGS:
            if name not in wanted:
                continue
            reference = (
                None if args.ours_only else _reference(args.peer, ids, table, batch, beam, per_beam)
            )
            ours = _ours(layer, table, batch, beam, per_beam, args.backend)
            floor = {
                f"floor: {mode}": call
                for mode, call in _ours(
                    layer, table, batch, beam, per_beam, args.backend, True
                ).items()
            }
            expected = None if reference is None else np.asarray(reference())
            for mode, call in ours.items():  # the first call also compiles
                got = np.asarray(call())
                if expected is not None and not np.array_equal(got, expected):
                    differ = int((got != expected).any(axis=2).sum())
                    raise AssertionError(f"{mode}, {name}, N={size}: {differ} beams differ")
            for call in floor.values():
                call()  # compiles
            timed = {**ours, **floor}
            times = {"reference": [], **{mode: [] for mode in timed}}
            engines = ([("reference", reference)] if reference else []) + list(timed.items())
            for round_ in range(args.rounds):
                # The order turns by one each round: no engine always runs
                # first or right after another (a position effect of up to
                # 0.15 in the ratio was seen at 1 x 1 with a fixed order).
                turn = round_ % len(engines)
                for mode, call in engines[turn:] + engines[:turn]:
                    if args.protocol == "serving loop":
                        evict()
                    start = time.perf_counter()
                    call()
                    times[mode].append(time.perf_counter() - start)
            for mode in timed:
                ratios = [a / b for a, b in zip(times[mode], times["reference"])]
                row = {
                    "backend": args.backend,
                    "n": size,
                    "config": name,
                    "mode": mode,
                    "ours_ms": statistics.median(times[mode]) * 1000,
                    "reference_ms": (
                        statistics.median(times["reference"]) * 1000 if ratios else None
                    ),
                    "ratio_median": statistics.median(ratios) if ratios else None,
                    "rounds": args.rounds,
                    "protocol": args.protocol,
                    "load_average": os.getloadavg()[0],
                }
                rows.append(row)
                versus = (
                    f"reference {row['reference_ms']:8.2f} ms  ratio {row['ratio_median']:.2f}"
                    if ratios
                    else "(no reference)"
                )
                print(f"N={size:>9,} {name:<18} {mode:<17} ours {row['ours_ms']:8.2f} ms  "
                      + versus, flush=True)  # fmt: skip
    path = os.path.join(args.out_dir, f"versus_reference_{args.backend}.csv")
    write_csv(path, rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
