"""The demo's synthetic world: a catalogue, its users, and a cold-start pool.

Generated in-process (no downloads), with the shape of a real recommender's
data: item embeddings drawn around topic clusters, Zipf popularity inside each
topic, upload times, a category and eligible regions per item; users who
prefer one or two topics and whose next item tends to follow the topic of
their last one.
"""

from __future__ import annotations

import dataclasses

import numpy as np

REGIONS = ("us", "eu", "apac")
SUBTOPICS = 6


@dataclasses.dataclass
class World:
    embeddings: np.ndarray  # float32 [N, dim]; items 1..N are ids, 0 is padding
    topics: np.ndarray  # int [N]
    subtopics: np.ndarray  # int [N], topic * SUBTOPICS + sub-cluster
    popularity: np.ndarray  # float [N], sums to 1 inside each topic
    days_ago: np.ndarray  # int [N], upload age at "now"
    categories: np.ndarray  # int [N]
    regions: np.ndarray  # uint8 [N] bitmask over REGIONS
    num_catalogue: int  # items [0, num_catalogue) exist at training time
    num_topics: int

    @property
    def num_items(self) -> int:
        return len(self.topics)

    def item_ids(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(rows) + 1  # id 0 is the history padding


def make_world(
    num_items: int, num_cold: int, *, num_topics: int = 24, dim: int = 32, seed: int = 0
) -> World:
    """A catalogue of `num_items` plus `num_cold` items uploaded after training."""
    rng = np.random.default_rng(seed)
    total = num_items + num_cold
    centers = rng.normal(size=(num_topics, dim)).astype(np.float32) * 1.5
    topics = rng.integers(0, num_topics, size=total)
    # Sub-topics give the embeddings (and so the semantic IDs) a second level.
    sub_centers = rng.normal(size=(num_topics, SUBTOPICS, dim)).astype(np.float32) * 0.9
    sub = rng.integers(0, SUBTOPICS, size=total)
    noise = rng.normal(size=(total, dim)).astype(np.float32) * 0.5
    embeddings = centers[topics] + sub_centers[topics, sub] + noise

    popularity = np.zeros(total)
    for topic in range(num_topics):
        for pool in (np.arange(num_items), np.arange(num_items, total)):
            members = pool[topics[pool] == topic]
            weights = 1.0 / (1 + rng.permutation(len(members))) ** 1.1
            popularity[members] = weights / max(weights.sum(), 1e-12)
    days_ago = rng.integers(8, 365, size=total)
    days_ago[num_items:] = rng.integers(0, 8, size=num_cold)  # cold start: this week
    return World(
        embeddings=embeddings,
        topics=topics,
        subtopics=topics * SUBTOPICS + sub,
        popularity=popularity,
        days_ago=days_ago,
        categories=topics % 8,
        regions=rng.integers(1, 8, size=total).astype(np.uint8),
        num_catalogue=num_items,
        num_topics=num_topics,
    )


def make_users(
    world: World, num_users: int, history_length: int, *, cold_targets: bool = False, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Histories `[U, H]` of item ids and the next item (a row index) per user.

    Users prefer one or two topics. Each next item stays in the sub-topic of
    the previous one with probability 0.5, in its topic with 0.25, and else
    follows the user's topic preferences; inside a pool, popular items are
    likelier. Histories come from the catalogue; with `cold_targets` the next
    item is drawn from the cold-start pool (items uploaded after training).
    """
    rng = np.random.default_rng(seed)
    prefs = rng.dirichlet(np.full(world.num_topics, 0.08), size=num_users)
    catalogue = np.arange(world.num_catalogue)
    cold = np.arange(world.num_catalogue, world.num_items)

    def pools(rows, keys, count):
        return [rows[keys[rows] == key] for key in range(count)]

    num_sub = world.num_topics * SUBTOPICS
    by_topic = {False: pools(catalogue, world.topics, world.num_topics),
                True: pools(cold, world.topics, world.num_topics)}  # fmt: skip
    by_sub = {False: pools(catalogue, world.subtopics, num_sub),
              True: pools(cold, world.subtopics, num_sub)}  # fmt: skip

    def draw(keys, table, fallback):
        out = np.empty(len(keys), dtype=np.int64)
        for key in np.unique(keys):
            users = np.flatnonzero(keys == key)
            pool = table[key] if len(table[key]) else fallback[key // SUBTOPICS]
            weights = world.popularity[pool] / world.popularity[pool].sum()
            out[users] = rng.choice(pool, size=len(users), p=weights)
        return out

    cumulative = prefs.cumsum(1)
    rows = np.empty((num_users, history_length + 1), dtype=np.int64)
    for position in range(history_length + 1):
        last = position == history_length
        is_cold = cold_targets and last
        preferred = np.minimum(
            (rng.random((num_users, 1)) > cumulative).sum(1), world.num_topics - 1
        )
        roll = rng.random(num_users)
        if position == 0:
            roll[:] = 1.0
        previous = rows[:, position - 1] if position else np.zeros(num_users, dtype=np.int64)
        same_sub = roll < 0.5
        same_topic = (roll >= 0.5) & (roll < 0.75)
        topic = np.where(same_sub | same_topic, world.topics[previous], preferred)
        picked = draw(topic, by_topic[is_cold], by_topic[is_cold])
        stay = draw(world.subtopics[previous], by_sub[is_cold], by_topic[is_cold])
        rows[:, position] = np.where(same_sub, stay, picked)
    return world.item_ids(rows[:, :-1]).astype(np.int32), rows[:, -1]
