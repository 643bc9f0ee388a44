"""The main job's quick mode: its invariants, its report, and its data."""

import os

import numpy as np
import pytest

from static_keras.demo import run_demo
from static_keras.demo.world import make_users
from static_keras.demo.world import make_world
from static_keras.index.semantic_ids import disambiguate
from static_keras.index.semantic_ids import fit_residual_kmeans


@pytest.mark.slow  # 75 s: the whole quick demo; CI runs it in the slow step
def test_quick_demo_invariants(tmp_path, capfd):
    results = run_demo(str(tmp_path), quick=True, print_fn=lambda *_: None)
    out, err = capfd.readouterr()
    # stdout is not a terminal here: no progress bars (carriage returns, ANSI codes).
    assert "\x1b[" not in out and "\r" not in out and "\x1b[" not in err
    unconstrained, catalogue, fresh = results["decoding"]
    assert catalogue["valid"] == 1.0 and fresh["valid"] == 1.0
    assert fresh["eligible"] == 1.0
    assert unconstrained["eligible"] < 1.0
    cold = results["cold_start"]
    assert cold["constrained_recall_at_1"] > cold["unconstrained_recall_at_1"]
    for region in results["regions"]:  # one index: per-request sets and exclusions
        assert region["constrained_eligible"] == 1.0 and region["constrained_history_hits"] == 0
        assert region["constrained_results"] == 10 * region["users"]
    swap = results["hot_swap"]
    assert swap["failures"] == 0 and swap["versions"] == [1, 2] and swap["requests"] > 0
    for name in ("report.md", "validity.png", "recall.png", "latency.png"):
        assert os.path.getsize(tmp_path / name) > 0


def test_semantic_ids_are_unique_and_coarse_to_fine():
    world = make_world(3000, 100, seed=1)
    rq = fit_residual_kmeans(world.embeddings[:3000], num_levels=2, vocab_size=16, seed=1)
    codes = rq.encode(world.embeddings[:3000])
    assert codes.shape == (3000, 2) and codes.max() < 16
    ids = disambiguate(codes)
    assert len(np.unique(ids, axis=0)) == 3000
    np.testing.assert_array_equal(ids[:, :2], codes)
    # Items of one topic share first-level codes more than random pairs do.
    same_topic = world.topics[:3000, None] == world.topics[None, :3000]
    same_code = codes[:, None, 0] == codes[None, :, 0]
    assert same_code[same_topic].mean() > 3 * same_code[~same_topic].mean()
    # Later items continue the collision counters: still unique.
    _, inverse, counts = np.unique(codes, axis=0, return_inverse=True, return_counts=True)
    more = disambiguate(codes[:10], start=counts[inverse.ravel()[:10]])
    assert len(np.unique(np.concatenate([ids, more]), axis=0)) == 3010


def test_users_follow_their_topics():
    world = make_world(5000, 500, seed=2)
    histories, targets = make_users(world, 400, 6, seed=3)
    assert histories.shape == (400, 6) and histories.min() >= 1
    last_topic = world.topics[histories[:, -1] - 1]
    assert (world.topics[targets] == last_topic).mean() > 0.6
    _, cold = make_users(world, 400, 6, cold_targets=True, seed=4)
    assert cold.min() >= world.num_catalogue
