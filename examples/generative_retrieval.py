"""Generative retrieval with a STATIC constraint, step by step.

A generative-retrieval recommender (TIGER) represents each item by a short
sequence of codes, its semantic ID, and trains a decoder to emit the semantic
ID of a user's next item. Decoding freely, the model can emit sequences that
are no item, or items that business rules exclude (stale, out of stock, not
sold in the user's region). static-keras compiles the allowed items into a
STATIC index and enforces it inside beam search.

    python examples/generative_retrieval.py [--quick]

Steps:
1. a catalogue and users (synthetic, generated here: no downloads);
2. semantic IDs by residual k-means plus a collision level;
3. a small transformer decoder trained with teacher forcing;
4. beam search without and with the constraint; validity and Recall@10.
"""

import argparse

import keras
import numpy as np

from static_keras import CachedTransformerDecoder
from static_keras import ConstrainedBeamSearch
from static_keras import StaticIndex
from static_keras import TeacherForcing
from static_keras.demo.world import make_users
from static_keras.demo.world import make_world
from static_keras.index.semantic_ids import disambiguate
from static_keras.index.semantic_ids import fit_residual_kmeans


def main(quick: bool) -> None:
    keras.utils.set_random_seed(0)
    num_items, num_users, epochs = (8_000, 6_000, 2) if quick else (50_000, 40_000, 4)

    # 1. A catalogue with topic-clustered embeddings, and users' histories.
    world = make_world(num_items, num_cold=0)
    histories, targets = make_users(world, num_users, history_length=8, seed=1)
    test_histories, test_targets = make_users(world, 256, history_length=8, seed=2)

    # 2. Semantic IDs: 3 levels of 64 codes, plus the rank among collisions.
    rq = fit_residual_kmeans(world.embeddings, num_levels=3, vocab_size=64)
    semantic_ids = disambiguate(rq.encode(world.embeddings))
    vocab, length = max(64, int(semantic_ids.max()) + 1), semantic_ids.shape[1]
    item_ids = world.item_ids(np.arange(num_items))

    # The valid set: every item; a business rule: items of the last 60 days.
    catalogue = StaticIndex.build(semantic_ids, vocab, item_ids=item_ids)
    fresh = world.days_ago < 60
    fresh_index = StaticIndex.build(semantic_ids[fresh], vocab, item_ids=item_ids[fresh])
    print(catalogue)

    # 3. The decoder: history in, semantic ID out. Training scores every
    # position at once (teacher forcing); decoding reuses a KV cache.
    decoder = CachedTransformerDecoder(
        vocab, length, context_vocab_size=num_items + 1, hidden_dim=48, num_layers=2
    )
    decoder.build()
    history = keras.Input((8,), dtype="int32", name="history")
    target = keras.Input((length,), dtype="int32", name="target")
    logits = TeacherForcing(decoder)(history, target)
    trainer = keras.Model([history, target], logits)
    trainer.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer.fit([histories, semantic_ids[targets]], semantic_ids[targets], epochs=epochs,
                batch_size=256, verbose=2)  # fmt: skip

    # 4. Beam search over the decoder, free and constrained.
    def recommend(index):
        search = ConstrainedBeamSearch(
            index, decoder, beam_size=20, num_results=10, length=None if index else length
        )
        return keras.Model(history, search(history)).predict(test_histories, verbose=0)

    for name, index in (("unconstrained", None), ("catalogue", catalogue),
                        ("fresh < 60 days", fresh_index)):  # fmt: skip
        out = recommend(index)
        found = catalogue.lookup_item_ids(out["tokens"].reshape(-1, length)).reshape(-1, 10)
        valid = (found >= 0).mean()
        fresh_share = np.isin(found, item_ids[fresh]).mean()
        recall = (found == item_ids[test_targets][:, None]).any(1).mean()
        print(f"{name:<16} valid {valid:6.1%}  fresh {fresh_share:6.1%}  Recall@10 {recall:6.1%}")
        if index is not None:
            assert (found >= 0).all()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run (CI)")
    main(parser.parse_args().quick)
