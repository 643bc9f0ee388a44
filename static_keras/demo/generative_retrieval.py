"""`static-keras demo`: generative retrieval with and without STATIC, end to end.

1. A synthetic catalogue (topic-clustered embeddings, Zipf popularity, upload
   times, categories, regions) and users with histories.
2. Semantic IDs by residual k-means plus a disambiguation level (TIGER).
3. A small Keras transformer decoder, trained with teacher forcing.
4. Beam search on held-out users: unconstrained, constrained to the
   catalogue, constrained to fresh items: validity, eligibility, Recall@10
   and time per decoding step.
5. Cold start: items uploaded after training; constrained to that pool the
   decoder recalls them, unconstrained it practically never does.
6. Regions and histories: the same model and index serve every region (an
   eligibility set each) and leave out each user's history (per-request
   exclusions): every result is in the user's region and none is a repeat.
7. Serving: export + publish version 1, query the development server,
   publish version 2 with a new freshness window (index-only refresh) while
   requests flow, and check that no request failed and the answers changed.
"""

from __future__ import annotations

import functools
import os
import time

import keras
import numpy as np

from static_keras.decoding.constrained_beam_search import ConstrainedBeamSearch
from static_keras.demo.catalogue_items import catalogue_items
from static_keras.demo.decoder_training import train_decoder
from static_keras.demo.demo_failure import DemoFailure
from static_keras.demo.hot_swap import serve_and_swap
from static_keras.demo.regions import regions_and_histories
from static_keras.demo.report import write_report
from static_keras.demo.world import make_users
from static_keras.demo.world import make_world
from static_keras.metrics.recall_at_k import recall_per_row

HISTORY = 8
TIMED_USERS = 128  # one batch, timed per decoding step
TIMING_ROUNDS = 9


def _recall(targets: np.ndarray, ranked: np.ndarray, k: int) -> np.ndarray:
    """float64 `[B]`: each user's Recall@k (`static_keras.metrics`), here 0 or 1."""
    return np.asarray(keras.ops.convert_to_numpy(recall_per_row(targets, ranked, k)[0]), "float64")


def _interleaved_times(models, inputs, rounds: int = TIMING_ROUNDS) -> list[list[float]]:
    """Seconds per `predict_on_batch(inputs)`, `rounds` per model.

    On a shared CPU the machine's speed drifts over seconds: timing one model
    after the other lets the drift decide their order. Each round times every
    model once, starting one later each round, so each sees the same drift.
    """
    for model in models:
        model.predict_on_batch(inputs)  # the first call of a batch shape may trace
    times = [[] for _ in models]
    for round_ in range(rounds):
        for i in np.roll(np.arange(len(models)), -round_):
            begin = time.perf_counter()
            models[i].predict_on_batch(inputs)
            times[i].append(time.perf_counter() - begin)
    return times


def _settings(quick: bool) -> dict:
    if quick:
        return dict(items=20_000, cold=1_000, train_users=12_000, test_users=256,
                    epochs=3, levels=3, vocab=128, hidden=48, beam=20)  # fmt: skip
    return dict(items=50_000, cold=2_000, train_users=40_000, test_users=512,
                epochs=4, levels=3, vocab=128, hidden=64, beam=20)  # fmt: skip


def run_demo(
    out_dir: str = "static_keras_demo",
    *,
    quick: bool = False,
    seed: int = 0,
    fresh_days: tuple[int, int] = (60, 30),
    serve: bool = True,
    print_fn=print,
) -> dict:
    """Runs the demo, writes `out_dir/report.md` and plots, returns the numbers.

    Raises:
        DemoFailure: if constrained decoding returned an invalid or ineligible
            item, or the hot swap failed a request.
    """
    cfg = _settings(quick)
    keras.utils.set_random_seed(seed)
    started = time.perf_counter()

    # 1-2. World and semantic IDs
    world = make_world(cfg["items"], cfg["cold"], seed=seed)
    items = catalogue_items(world, cfg, seed)
    ids, vocab, length = items.ids, items.vocab, items.length
    catalogue = np.arange(world.num_catalogue)
    cold = np.arange(world.num_catalogue, world.num_items)
    build_start = time.perf_counter()
    catalogue_index = items.index_of(catalogue)
    build_ms = 1e3 * (time.perf_counter() - build_start)
    fresh = catalogue[world.days_ago[catalogue] < fresh_days[0]]
    fresh_index = items.index_of(fresh)
    print_fn(f"catalogue: {world.num_catalogue:,} items, semantic IDs {length} x {vocab} codes; "
             f"{catalogue_index}")  # fmt: skip

    # 3. Train the decoder on histories read as semantic IDs
    history_in = keras.Input((HISTORY * length,), dtype="int32", name="history")
    decoder, train_seconds = train_decoder(world, cfg, items, history_in, HISTORY, seed)
    beam = cfg["beam"]
    search_model = functools.partial(_search_model, decoder, history_in, beam, length)

    # 4. Decode held-out users
    test_items, test_targets = make_users(world, cfg["test_users"], HISTORY, seed=seed + 2)
    test_histories = items.history_tokens(test_items)
    decodings = [
        ("unconstrained", None),
        ("constrained: catalogue", catalogue_index),
        (f"constrained: fresh < {fresh_days[0]} d", fresh_index),
    ]
    models = [search_model(index) for _, index in decodings]
    rows = _compare_decodings(
        decodings, models, test_histories, ids[test_targets], catalogue_index,
        set(ids[fresh].tolist()), length, beam, print_fn,
    )  # fmt: skip

    # 5. Cold start: items uploaded after training
    cold_start = _cold_start(world, cfg, seed, cold, items, search_model, print_fn)

    # 6. Regions and histories: one index, per-request sets and exclusions
    regions = regions_and_histories(
        world, catalogue_index, ids[catalogue], decoder, beam, test_histories, test_items, print_fn
    )

    results = dict(
        num_items=world.num_catalogue, length=length, vocab_size=vocab,
        index_bytes=catalogue_index.nbytes, build_ms=build_ms,
        decoder_parameters=int(sum(np.prod(w.shape) for w in decoder.weights)),
        train_seconds=train_seconds, epochs=cfg["epochs"], test_users=cfg["test_users"],
        beam_size=beam, timed_users=TIMED_USERS, timing_rounds=TIMING_ROUNDS, decoding=rows,
        cold_start=cold_start, regions=regions,
    )  # fmt: skip

    # 7. Serve and hot-swap
    if serve:
        newer = catalogue[world.days_ago[catalogue] < fresh_days[1]]
        results["hot_swap"] = serve_and_swap(
            search_model(fresh_index), items.index_of(newer), test_histories[:16],
            fresh_days, set(ids[newer].tolist()), print_fn,
        )  # fmt: skip

    files = write_report(out_dir, results)
    results["seconds"] = time.perf_counter() - started
    print_fn(f"\nwrote {', '.join(os.path.join(out_dir, f) for f in files)} "
             f"({results['seconds']:.0f} s in all)")  # fmt: skip
    return results


def _search_model(decoder, history_in, beam: int, length: int, index):
    """Histories -> the top 10 of a beam search over `index` (None: unconstrained)."""
    options = {} if index is not None else {"length": length}
    layer = ConstrainedBeamSearch(index, decoder, beam_size=beam, num_results=10, **options)
    return keras.Model(history_in, layer(history_in))


def _cold_start(world, cfg, seed, cold, items, search_model, print_fn):
    """Recall@1 of users whose next item was uploaded after training,
    unconstrained and constrained to the pool of new items."""
    cold_histories, cold_targets = make_users(
        world, 4 * cfg["test_users"], HISTORY, cold_targets=True, seed=seed + 3
    )
    cold_histories = items.history_tokens(cold_histories)
    free = _decode(search_model(None), cold_histories)
    free_top1 = items.index_of(np.arange(world.num_items)).lookup_item_ids(free["tokens"][:, 0])
    pool = _decode(search_model(items.index_of(cold)), cold_histories)
    ids = items.ids
    cold_start = dict(
        items=len(cold),
        users=len(cold_targets),
        unconstrained_recall_at_1=float(_recall(ids[cold_targets], free_top1[:, None], k=1).mean()),
        constrained_recall_at_1=float(_recall(ids[cold_targets], pool["item_ids"], k=1).mean()),
    )
    print_fn(f"\ncold start ({len(cold):,} new items): Recall@1 unconstrained "
             f"{cold_start['unconstrained_recall_at_1']:.1%}, constrained to the pool "
             f"{cold_start['constrained_recall_at_1']:.1%}")  # fmt: skip
    return cold_start


def _decode(model, inputs):
    model.predict(inputs[:128], batch_size=128, verbose=0)  # trace, compile, warm up
    return model.predict(inputs, batch_size=128, verbose=0)


def _compare_decodings(decodings, models, histories, target_ids, catalogue_index, eligible_ids,
                       length, beam, print_fn) -> list[dict]:  # fmt: skip
    """Validity, eligibility, Recall@10 and time per step of each decoding
    (`(name, index)`) on held-out users; printed as a table."""
    rows = []
    fresh_target = np.isin(target_ids, list(eligible_ids))
    for (name, index), model in zip(decodings, models):
        out = _decode(model, histories)
        tokens = out["tokens"].reshape(-1, length)
        returned = tokens[:, 0] >= 0
        item_ids = catalogue_index.lookup_item_ids(tokens)
        if index is not None and not np.array_equal(
            out["item_ids"].reshape(-1)[returned], item_ids[returned]
        ):
            raise DemoFailure(f"{name}: item ids disagree with the index")
        valid = item_ids[returned] >= 0
        eligible = np.isin(item_ids[returned], list(eligible_ids))
        hits = _recall(target_ids, item_ids.reshape(-1, 10), k=10)
        rows.append(
            dict(name=name, valid=float(valid.mean()), eligible=float(eligible.mean()),
                 recall_at_10=float(hits.mean()),
                 recall_at_10_fresh_targets=float(hits[fresh_target].mean()))
        )  # fmt: skip
    for row, times in zip(rows, _interleaved_times(models, histories[:TIMED_USERS])):
        ms = 1e3 * np.asarray(times) / length
        p25, p75 = np.percentile(ms, [25, 75])
        row.update(
            ms_per_step=float(np.median(ms)), ms_per_step_p25=float(p25), ms_per_step_p75=float(p75)
        )
    print_fn("")
    print_fn(f"{'decoding':<28}{'valid':>8}{'eligible':>10}{'Recall@10':>11}"
             f"{'R@10 fresh':>12}{'ms/step (IQR)':>20}")  # fmt: skip
    for row in rows:
        spread = f"({row['ms_per_step_p25']:.1f}-{row['ms_per_step_p75']:.1f})"
        print_fn(f"{row['name']:<28}{row['valid']:>8.1%}{row['eligible']:>10.1%}"
                 f"{row['recall_at_10']:>11.1%}{row['recall_at_10_fresh_targets']:>12.1%}"
                 f"{row['ms_per_step']:>8.2f} {spread:>11}")  # fmt: skip
    print_fn(f"(R@10 fresh: users whose next item is fresh, {fresh_target.mean():.0%} of them; "
             f"ms/step: {TIMED_USERS} users x beam {beam}, median and interquartile range of "
             f"{TIMING_ROUNDS} rounds that time the three in turn)")  # fmt: skip
    if rows[1]["valid"] != 1.0 or rows[2]["valid"] != 1.0 or rows[2]["eligible"] != 1.0:
        raise DemoFailure("constrained decoding returned an invalid or ineligible item")
    return rows
