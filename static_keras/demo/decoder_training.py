"""The demo's decoder: a small transformer trained with teacher forcing on
users' next items."""

from __future__ import annotations

import sys
import time

import keras

from static_keras.demo.world import make_users
from static_keras.layers.cached_transformer_decoder import CachedTransformerDecoder
from static_keras.layers.cached_transformer_decoder import TeacherForcing


def train_decoder(world, cfg: dict, items, history_in, history: int, seed: int):
    """`(decoder, seconds)`: the decoder of `items` (`CatalogueItems`),
    trained on `cfg["train_users"]` users' histories of `history` items."""
    vocab, length = items.vocab, items.length
    histories, targets = make_users(world, cfg["train_users"], history, seed=seed + 1)
    decoder = CachedTransformerDecoder(
        vocab, length, context_vocab_size=vocab * length + 1, hidden_dim=cfg["hidden"],
        num_heads=4, num_layers=2,
    )  # fmt: skip
    decoder.build()  # its variables are named after the decoder, not the trainer
    target_in = keras.Input((length,), dtype="int32", name="target")
    trainer = keras.Model(
        [history_in, target_in],
        TeacherForcing(decoder)(history_in, target_in),
    )
    trainer.compile(
        optimizer=keras.optimizers.Adam(2e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    train_start = time.perf_counter()
    sids = items.sids
    trainer.fit(
        [items.history_tokens(histories), sids[targets]], sids[targets], batch_size=256,
        epochs=cfg["epochs"], verbose=1 if sys.stdout.isatty() else 2,  # no bars in a log file
    )  # fmt: skip
    return decoder, time.perf_counter() - train_start
