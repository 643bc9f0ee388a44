"""The demo's items as the model and the indexes see them: semantic IDs,
item ids, an index over any rows, a history as tokens."""

from __future__ import annotations

import dataclasses

import numpy as np

from static_keras.index.semantic_ids import disambiguate
from static_keras.index.semantic_ids import fit_residual_kmeans
from static_keras.index.static_index import StaticIndex


@dataclasses.dataclass
class CatalogueItems:
    """Every item of a demo world (catalogue and cold-start) with its
    semantic ID (`sids`, int32 `[items, length]`) and item id (`ids`)."""

    sids: np.ndarray
    vocab: int
    ids: np.ndarray

    @property
    def length(self) -> int:
        return self.sids.shape[1]

    def index_of(self, rows) -> StaticIndex:
        """The index of the items at `rows`."""
        return StaticIndex.build(self.sids[rows], self.vocab, item_ids=self.ids[rows])

    def history_tokens(self, item_id_rows: np.ndarray) -> np.ndarray:
        """int32 `[users, history * length]`. As in TIGER, a history is read
        as the semantic IDs of its items (one token per level, offset by
        level; 0 pads): items that share codes share what the model learns,
        which is what lets it reach cold-start items."""
        tokens = self.sids[item_id_rows - 1] + 1 + self.vocab * np.arange(self.length)
        return tokens.reshape(len(item_id_rows), -1).astype(np.int32)


def catalogue_items(world, cfg: dict, seed: int) -> CatalogueItems:
    """The items of `world` with semantic IDs fitted on its catalogue."""
    sids = semantic_ids(world, cfg, seed)
    vocab = int(max(cfg["vocab"], sids.max() + 1))
    return CatalogueItems(sids, vocab, world.item_ids(np.arange(world.num_items)))


def semantic_ids(world, cfg: dict, seed: int) -> np.ndarray:
    """int32 `[items, levels + 1]`: residual k-means codes fitted on the
    catalogue plus a disambiguation level (TIGER); cold items continue each
    code's collision counter."""
    catalogue = np.arange(world.num_catalogue)
    rq = fit_residual_kmeans(
        world.embeddings[catalogue], num_levels=cfg["levels"], vocab_size=cfg["vocab"], seed=seed
    )
    codes = rq.encode(world.embeddings)
    sids = np.empty((world.num_items, cfg["levels"] + 1), dtype=np.int32)
    sids[catalogue] = disambiguate(codes[catalogue])
    cold = np.arange(world.num_catalogue, world.num_items)
    taken = {tuple(row): 0 for row in codes[catalogue]}
    for row in codes[catalogue]:
        taken[tuple(row)] += 1
    start = np.array([taken.get(tuple(row), 0) for row in codes[cold]])
    sids[cold] = disambiguate(codes[cold], start=start)
    return sids
