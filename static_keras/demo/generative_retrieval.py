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

import os
import sys
import tempfile
import threading
import time

import keras
import numpy as np

from static_keras.decoding.constrained_beam_search import ConstrainedBeamSearch
from static_keras.demo.report import write_report
from static_keras.demo.world import REGIONS
from static_keras.demo.world import make_users
from static_keras.demo.world import make_world
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.semantic_ids import disambiguate
from static_keras.index.semantic_ids import fit_residual_kmeans
from static_keras.index.static_index import StaticIndex
from static_keras.layers.cached_transformer_decoder import CachedTransformerDecoder
from static_keras.layers.cached_transformer_decoder import TeacherForcing
from static_keras.layers.constrained_decoding import ConstrainedDecoding
from static_keras.metrics.recall_at_k import recall_per_row

HISTORY = 8
REGION_USERS = 32  # users decoded per region in step 6
TIMED_USERS = 128  # one batch, timed per decoding step
TIMING_ROUNDS = 9


class DemoFailure(RuntimeError):
    """An invariant the demo promises did not hold."""


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

    # 1-2. World and semantic IDs -------------------------------------------------
    world = make_world(cfg["items"], cfg["cold"], seed=seed)
    catalogue = np.arange(world.num_catalogue)
    rq = fit_residual_kmeans(
        world.embeddings[catalogue], num_levels=cfg["levels"], vocab_size=cfg["vocab"], seed=seed
    )
    codes = rq.encode(world.embeddings)
    sids = np.empty((world.num_items, cfg["levels"] + 1), dtype=np.int32)
    sids[catalogue] = disambiguate(codes[catalogue])
    # Cold items continue each code's collision counter.
    cold = np.arange(world.num_catalogue, world.num_items)
    taken = {tuple(row): 0 for row in codes[catalogue]}
    for row in codes[catalogue]:
        taken[tuple(row)] += 1
    start = np.array([taken.get(tuple(row), 0) for row in codes[cold]])
    sids[cold] = disambiguate(codes[cold], start=start)
    vocab = int(max(cfg["vocab"], sids.max() + 1))
    length = sids.shape[1]
    ids = world.item_ids(np.arange(world.num_items))

    def index_of(rows):
        return StaticIndex.build(sids[rows], vocab, item_ids=ids[rows])

    build_start = time.perf_counter()
    catalogue_index = index_of(catalogue)
    build_ms = 1e3 * (time.perf_counter() - build_start)
    fresh = catalogue[world.days_ago[catalogue] < fresh_days[0]]
    fresh_index = index_of(fresh)
    print_fn(f"catalogue: {world.num_catalogue:,} items, semantic IDs {length} x {vocab} codes; "
             f"{catalogue_index}")  # fmt: skip

    # 3. Train the decoder ----------------------------------------------------------
    # As in TIGER, the history is read as the semantic IDs of its items (one
    # token per level, offset by level; 0 pads): items that share codes share
    # what the model learns, which is what lets it reach cold-start items.
    def history_tokens(item_id_rows):
        tokens = sids[item_id_rows - 1] + 1 + vocab * np.arange(length)
        return tokens.reshape(len(item_id_rows), -1).astype(np.int32)

    histories, targets = make_users(world, cfg["train_users"], HISTORY, seed=seed + 1)
    histories = history_tokens(histories)
    decoder = CachedTransformerDecoder(
        vocab, length, context_vocab_size=vocab * length + 1, hidden_dim=cfg["hidden"],
        num_heads=4, num_layers=2,
    )  # fmt: skip
    decoder.build()  # its variables are named after the decoder, not the trainer
    history_in = keras.Input((HISTORY * length,), dtype="int32", name="history")
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
    trainer.fit(
        [histories, sids[targets]], sids[targets], batch_size=256, epochs=cfg["epochs"],
        verbose=1 if sys.stdout.isatty() else 2,  # no progress bars in a log file
    )  # fmt: skip
    train_seconds = time.perf_counter() - train_start

    # 4. Decode held-out users ------------------------------------------------------
    test_items, test_targets = make_users(world, cfg["test_users"], HISTORY, seed=seed + 2)
    test_histories = history_tokens(test_items)
    beam = cfg["beam"]

    def search_model(index):
        layer = (
            ConstrainedBeamSearch(index, decoder, beam_size=beam, num_results=10)
            if index is not None
            else ConstrainedBeamSearch(None, decoder, beam_size=beam, num_results=10, length=length)
        )
        return keras.Model(history_in, layer(history_in))

    def decode(model, inputs):
        model.predict(inputs[:128], batch_size=128, verbose=0)  # trace, compile, warm up
        return model.predict(inputs, batch_size=128, verbose=0)

    eligible_ids = set(ids[fresh].tolist())
    decodings = [
        ("unconstrained", None),
        ("constrained: catalogue", catalogue_index),
        (f"constrained: fresh < {fresh_days[0]} d", fresh_index),
    ]
    models = [search_model(index) for _, index in decodings]
    rows = []
    for (name, index), model in zip(decodings, models):
        out = decode(model, test_histories)
        tokens = out["tokens"].reshape(-1, length)
        returned = tokens[:, 0] >= 0
        item_ids = catalogue_index.lookup_item_ids(tokens)
        if index is not None and not np.array_equal(
            out["item_ids"].reshape(-1)[returned], item_ids[returned]
        ):
            raise DemoFailure(f"{name}: item ids disagree with the index")
        valid = item_ids[returned] >= 0
        eligible = np.isin(item_ids[returned], list(eligible_ids))
        hits = _recall(ids[test_targets], item_ids.reshape(-1, 10), k=10)
        fresh_target = np.isin(ids[test_targets], list(eligible_ids))
        rows.append(
            dict(name=name, valid=float(valid.mean()), eligible=float(eligible.mean()),
                 recall_at_10=float(hits.mean()),
                 recall_at_10_fresh_targets=float(hits[fresh_target].mean()))
        )  # fmt: skip
    for row, times in zip(rows, _interleaved_times(models, test_histories[:TIMED_USERS])):
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

    # 5. Cold start -----------------------------------------------------------------
    cold_histories, cold_targets = make_users(
        world, 4 * cfg["test_users"], HISTORY, cold_targets=True, seed=seed + 3
    )
    cold_histories = history_tokens(cold_histories)
    everything = index_of(np.arange(world.num_items))
    free = decode(search_model(None), cold_histories)
    free_top1 = everything.lookup_item_ids(free["tokens"][:, 0])
    pool = decode(search_model(index_of(cold)), cold_histories)
    cold_start = dict(
        items=len(cold),
        users=len(cold_targets),
        unconstrained_recall_at_1=float(_recall(ids[cold_targets], free_top1[:, None], k=1).mean()),
        constrained_recall_at_1=float(_recall(ids[cold_targets], pool["item_ids"], k=1).mean()),
    )
    print_fn(f"\ncold start ({len(cold):,} new items): Recall@1 unconstrained "
             f"{cold_start['unconstrained_recall_at_1']:.1%}, constrained to the pool "
             f"{cold_start['constrained_recall_at_1']:.1%}")  # fmt: skip

    # 6. Regions and histories: one index, per-request sets and exclusions -----------
    regions = _regions_and_histories(
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

    # 7. Serve and hot-swap ---------------------------------------------------------
    if serve:
        days = fresh_days[1]
        newer = catalogue[world.days_ago[catalogue] < days]
        results["hot_swap"] = _serve_and_swap(
            search_model(fresh_index), index_of(newer), test_histories[:16],
            fresh_days, set(ids[newer].tolist()), print_fn,
        )  # fmt: skip

    files = write_report(out_dir, results)
    results["seconds"] = time.perf_counter() - started
    print_fn(f"\nwrote {', '.join(os.path.join(out_dir, f) for f in files)} "
             f"({results['seconds']:.0f} s in all)")  # fmt: skip
    return results


def _regions_and_histories(
    world, index, catalogue_ids, decoder, beam, histories, history_items, print_fn
) -> list[dict]:
    """Decodes `REGION_USERS` users per region in one batch with one layer:
    each row names its region's eligibility set and excludes its history.
    Returns per region the share of results in the region and the history
    hits, with and without the per-request constraints."""
    in_region = {
        name: (world.regions[catalogue_ids - 1] >> bit) & 1 == 1 for bit, name in enumerate(REGIONS)
    }
    sets = EligibilitySets.build(index, {n: catalogue_ids[m] for n, m in in_region.items()})
    layer = ConstrainedDecoding(index, eligibility=sets)
    search = ConstrainedBeamSearch(constraint=layer, decoder=decoder, beam_size=beam,
                                   num_results=10)  # fmt: skip
    users = np.arange(len(REGIONS) * REGION_USERS)
    set_ids = (users // REGION_USERS).astype(np.int32)  # region r: users r*32 ... r*32+31
    excluded = sets.catalogue.exclusion_members(history_items[users])
    plain = search(histories[users])["item_ids"]
    constrained = search(histories[users], set_ids, excluded)["item_ids"]
    rows = []
    for region, name in enumerate(REGIONS):
        row = dict(region=name, users=REGION_USERS)
        for label, out in (("plain", plain), ("constrained", constrained)):
            items = np.asarray(out)[set_ids == region]
            history = history_items[users[set_ids == region]]
            returned = items >= 0
            eligible = np.isin(items, catalogue_ids[in_region[name]]) & returned
            repeats = (items[:, :, None] == history[:, None, :]).any(-1) & returned
            row[f"{label}_results"] = int(returned.sum())
            row[f"{label}_eligible"] = float(eligible.sum() / max(returned.sum(), 1))
            row[f"{label}_history_hits"] = int(repeats.sum())
        rows.append(row)
    print_fn(f"\nregions and histories: one index, {len(REGIONS)} eligibility sets "
             f"({sets.bits_per_member:.2f} bits per member each), {REGION_USERS} users per "
             f"region, each excluding its {HISTORY}-item history")  # fmt: skip
    for row in rows:
        without = f"{row['plain_eligible']:.0%}, {row['plain_history_hits']}"
        print_fn(f"  {row['region']:<5} in region {row['constrained_eligible']:.0%}, history "
                 f"hits {row['constrained_history_hits']} (without the per-request "
                 f"constraints: {without})")  # fmt: skip
    for row in rows:
        if (
            row["constrained_eligible"] != 1.0
            or row["constrained_history_hits"]
            or row["constrained_results"] != 10 * REGION_USERS
        ):
            raise DemoFailure(f"region {row['region']}: a result outside the region or a repeat")
    return rows


def _serve_and_swap(model, newer_index, histories, fresh_days, newer_ids, print_fn) -> dict:
    from static_keras.export import publish
    from static_keras.export import replace_index
    from static_keras.serving import GrpcClient
    from static_keras.serving import ServedModel
    from static_keras.serving import ServingError
    from static_keras.serving.dev_server import DevServer

    with tempfile.TemporaryDirectory() as base:
        first = publish(model, base, warmup_batch_sizes=(len(histories),), model_name="recs")
        print_fn(f"\npublished version {first.version} (fresh < {fresh_days[0]} d) "
                 f"in {first.seconds:.1f} s")  # fmt: skip
        answers, failures, stop = [], [], threading.Event()
        with DevServer([ServedModel("recs", base)], poll_seconds=0.2) as server:
            client = GrpcClient(server.grpc_address, timeout=60)
            before = client.predict("recs", {"history": histories})

            def load():
                deadline = time.monotonic() + 120
                while not stop.is_set() and time.monotonic() < deadline:
                    try:
                        answers.append(client.predict("recs", {"history": histories}))
                    except ServingError as error:
                        failures.append(str(error))

            worker = threading.Thread(target=load)
            worker.start()
            second = publish(
                replace_index(model, newer_index), base,
                warmup_batch_sizes=(len(histories),), model_name="recs",
            )  # fmt: skip
            server.wait_for_version("recs", second.version)
            after = client.predict("recs", {"history": histories})
            stop.set()
            worker.join()
            client.close()
        versions = {answer["model_version"] for answer in answers} | {
            before["model_version"],
            after["model_version"],
        }
        changed = float(np.mean(np.any(before["item_ids"] != after["item_ids"], axis=1)))
        returned = after["item_ids"][after["item_ids"] >= 0]
        swap = dict(
            v1_days=fresh_days[0], v2_days=fresh_days[1], requests=len(answers),
            failures=len(failures), versions=sorted(versions), changed_share=changed,
        )  # fmt: skip
        print_fn(f"published version {second.version} (fresh < {fresh_days[1]} d) under load: "
                 f"{len(answers)} requests, {len(failures)} failed, versions served "
                 f"{sorted(versions)}; answers changed for {changed:.0%} of users")  # fmt: skip
        if failures or versions != {1, 2}:
            raise DemoFailure(f"hot swap failed: {failures[:3]} versions {sorted(versions)}")
        if not set(returned.tolist()) <= newer_ids:
            raise DemoFailure("version 2 returned items outside its freshness window")
    return swap
