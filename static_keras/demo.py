"""`static-keras demo`: constrained vs unconstrained decoding, end to end.

Builds a catalogue of semantic IDs with item ids, compiles it into a
`StaticIndex`, and decodes users' top items with a small Keras transformer
decoder (`CachedTransformerDecoder`, random weights: the point here is the
constraint, not the ranking) inside a functional model that wraps
`ConstrainedBeamSearch`. The same decoder decoded without the constraint
shows what the index prevents: sequences that are no item at all.
"""

from __future__ import annotations

import time

import keras
import numpy as np

from static_keras.decoding.constrained_beam_search import ConstrainedBeamSearch
from static_keras.index.static_index import StaticIndex
from static_keras.layers.cached_transformer_decoder import CachedTransformerDecoder


def run_demo(
    *,
    num_items: int = 50_000,
    vocab_size: int = 256,
    length: int = 4,
    num_users: int = 64,
    beam_size: int = 20,
    seed: int = 0,
    print_fn=print,
) -> dict:
    """Runs the demo and returns its measurements (also printed)."""
    rng = np.random.default_rng(seed)
    keras.utils.set_random_seed(seed)

    # A catalogue: each item gets a semantic ID whose first levels follow a
    # skewed (Zipf) code distribution, like RQ-VAE / RQ-KMeans codes of
    # clustered embeddings; one semantic ID per item.
    head = np.minimum(rng.zipf(1.5, size=(num_items * 2, 2)) - 1, vocab_size - 1)
    tail = rng.integers(0, vocab_size, size=(num_items * 2, length - 2))
    codes = np.unique(np.concatenate([head, tail], axis=1), axis=0)
    codes = codes[rng.permutation(len(codes))[:num_items]]
    num_items = len(codes)
    item_ids = np.arange(1_000_000, 1_000_000 + num_items)
    start = time.perf_counter()
    index = StaticIndex.build(codes, vocab_size, item_ids=item_ids, on_duplicate_item="first")
    build_ms = 1e3 * (time.perf_counter() - start)
    print_fn(f"catalogue: {num_items:,} items -> {index}")
    print_fn(f"index built in {build_ms:.1f} ms, {index.nbytes / 2**20:.2f} MiB on device")

    history_len = 8
    decoder = CachedTransformerDecoder(
        vocab_size=vocab_size, length=length, context_vocab_size=num_items + 1, hidden_dim=32
    )
    histories = rng.integers(1, num_items + 1, size=(num_users, history_len)).astype("int32")

    inputs = keras.Input((history_len,), dtype="int32", name="history")
    models = {
        "constrained": ConstrainedBeamSearch(index, decoder, beam_size=beam_size, num_results=10),
        "unconstrained": ConstrainedBeamSearch(
            None, decoder, beam_size=beam_size, num_results=10, length=length
        ),
    }
    outputs, times = {}, {}
    for name, search in models.items():
        model = keras.Model(inputs, search(inputs))
        model.predict(histories, verbose=0)  # trace and warm up
        start = time.perf_counter()
        outputs[name] = model.predict(histories, verbose=0)
        times[name] = 1e3 * (time.perf_counter() - start)
    constrained, free = outputs["constrained"], outputs["unconstrained"]
    constrained_ms, free_ms = times["constrained"], times["unconstrained"]

    free_tokens = free["tokens"].reshape(-1, length)
    tokens = constrained["tokens"].reshape(-1, length)
    results = {
        "build_ms": build_ms,
        "constrained_valid": float(index.contains(tokens).mean()),
        "unconstrained_valid": float(index.contains(free_tokens).mean()),
        "constrained_ms": constrained_ms,
        "unconstrained_ms": free_ms,
        "item_ids_match": bool(
            np.array_equal(index.lookup_item_ids(tokens), constrained["item_ids"].reshape(-1))
        ),
    }
    print_fn("")
    print_fn(f"{'decoding':<14}{'valid items':>12}{'time (ms)':>12}")
    print_fn(f"{'unconstrained':<14}{results['unconstrained_valid']:>12.1%}{free_ms:>12.1f}")
    print_fn(f"{'constrained':<14}{results['constrained_valid']:>12.1%}{constrained_ms:>12.1f}")
    print_fn("")
    print_fn(f"user 0, top 5 items: {constrained['item_ids'][0, :5].tolist()}")
    print_fn(f"  semantic IDs: {constrained['tokens'][0, :5].tolist()}")
    print_fn(f"  log-probs:    {[round(float(x), 2) for x in constrained['scores'][0, :5]]}")
    return results
