"""Semantic IDs from item embeddings: residual k-means (RQ-KMeans), NumPy only.

Level 1 clusters the embeddings; level 2 clusters what level 1 left over
(the residuals), and so on, so an item's code sequence goes from coarse to
fine and similar items share prefixes: the structure a generative-retrieval
decoder learns. Items whose codes collide get one more token, their rank in
the collision group (TIGER's disambiguation level), so each item has a
unique ID.

References:
    Rajput et al., "Recommender Systems with Generative Retrieval" (TIGER).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class ResidualKMeans:
    """Codebooks of a fitted RQ-KMeans: `codebooks[level]` is `[V, dim]`."""

    codebooks: tuple[np.ndarray, ...]

    @property
    def num_levels(self) -> int:
        return len(self.codebooks)

    @property
    def vocab_size(self) -> int:
        return self.codebooks[0].shape[0]

    def encode(self, embeddings: np.ndarray) -> np.ndarray:
        """int32 `[N, levels]`: the nearest code at each level, on residuals."""
        residual = np.asarray(embeddings, dtype=np.float32).copy()
        codes = np.empty((residual.shape[0], self.num_levels), dtype=np.int32)
        for level, centroids in enumerate(self.codebooks):
            codes[:, level] = _nearest(residual, centroids)
            residual -= centroids[codes[:, level]]
        return codes


def _nearest(points: np.ndarray, centroids: np.ndarray, chunk: int = 65536) -> np.ndarray:
    out = np.empty(points.shape[0], dtype=np.int32)
    norms = (centroids**2).sum(1)
    for start in range(0, points.shape[0], chunk):
        block = points[start : start + chunk]
        out[start : start + chunk] = np.argmin(norms[None] - 2 * block @ centroids.T, axis=1)
    return out


def _kmeans(points: np.ndarray, k: int, iterations: int, rng: np.random.Generator) -> np.ndarray:
    """Lloyd's k-means with k-means++-style seeding on a sample; vectorised."""
    n = points.shape[0]
    sample = points[rng.choice(n, size=min(n, 20 * k), replace=False)]
    centroids = [sample[rng.integers(len(sample))]]
    distance = ((sample - centroids[0]) ** 2).sum(1)
    for _ in range(1, k):
        total = distance.sum()
        pick = (
            rng.choice(len(sample), p=distance / total) if total > 0 else rng.integers(len(sample))
        )
        centroids.append(sample[pick])
        distance = np.minimum(distance, ((sample - sample[pick]) ** 2).sum(1))
    centroids = np.stack(centroids).astype(np.float32)
    for _ in range(iterations):
        assign = _nearest(points, centroids)
        counts = np.bincount(assign, minlength=k)
        sums = np.zeros_like(centroids)
        np.add.at(sums, assign, points)
        empty = counts == 0
        centroids[~empty] = sums[~empty] / counts[~empty, None]
        if empty.any():  # re-seed empty clusters on random points
            centroids[empty] = points[rng.choice(n, size=int(empty.sum()), replace=False)]
    return centroids


def fit_residual_kmeans(
    embeddings: np.ndarray, *, num_levels: int, vocab_size: int, iterations: int = 15, seed: int = 0
) -> ResidualKMeans:
    """Fits `num_levels` codebooks of `vocab_size` codes on the residuals."""
    points = np.asarray(embeddings, dtype=np.float32)
    if points.ndim != 2 or points.shape[0] < vocab_size:
        raise ValueError(
            f"`embeddings` must be [N, dim] with N >= vocab_size={vocab_size}. "
            f"Received shape {points.shape}"
        )
    rng = np.random.default_rng(seed)
    residual = points.copy()
    codebooks = []
    for _ in range(num_levels):
        centroids = _kmeans(residual, vocab_size, iterations, rng)
        residual -= centroids[_nearest(residual, centroids)]
        codebooks.append(centroids)
    return ResidualKMeans(tuple(codebooks))


def disambiguate(codes: np.ndarray, *, start: np.ndarray | None = None) -> np.ndarray:
    """Appends TIGER's collision level: each item's rank among equal codes.

    Args:
        codes: int `[N, levels]`.
        start: optional int `[N]` added to the ranks: the number of items that
            already hold each code (for items added later, e.g. cold start).

    Returns:
        int32 `[N, levels + 1]`, unique rows when `start` is consistent.
    """
    codes = np.asarray(codes)
    order = np.lexsort(codes.T[::-1])
    ordered = codes[order]
    new_group = np.ones(len(codes), dtype=bool)
    new_group[1:] = np.any(ordered[1:] != ordered[:-1], axis=1)
    group_start = np.maximum.accumulate(np.where(new_group, np.arange(len(codes)), 0))
    rank = np.empty(len(codes), dtype=np.int64)
    rank[order] = np.arange(len(codes)) - group_start
    if start is not None:
        rank += np.asarray(start)
    return np.concatenate([codes, rank[:, None]], axis=1).astype(np.int32)
