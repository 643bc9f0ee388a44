"""Daily freshness refresh with labels and a rollback.

A recommender may only return items uploaded in the last N days. The decoder
is trained once; every day a new index of the eligible items is compiled and
published as a new SavedModel version (same decoder weights, new index: an
index-only refresh). Clients ask for the `stable` label; a new version first
takes the `canary` label, is checked, then becomes `stable`. When a day's
index turns out wrong, moving `stable` back is the rollback: the server
re-reads its `models.config` and no request fails.

Production runs `tensorflow_model_server --model_config_file=...
--model_config_file_poll_wait_seconds=60` (docs/serving.md); this script uses
the development server, which reads the same file.

    python examples/freshness_hot_swap.py [--quick]
"""

import argparse
import tempfile
import time

import keras
import numpy as np

from static_keras import CachedTransformerDecoder
from static_keras import ConstrainedBeamSearch
from static_keras import StaticIndex
from static_keras.export import publish
from static_keras.export import read_metadata
from static_keras.export import replace_index
from static_keras.serving import GrpcClient
from static_keras.serving import ServedModel
from static_keras.serving import ServingError
from static_keras.serving import write_models_config
from static_keras.serving.dev_server import DevServer


def main(quick: bool) -> None:
    rng = np.random.default_rng(0)
    num_items, vocab, length = (5_000, 32, 3) if quick else (200_000, 64, 4)
    semantic_ids = rng.integers(0, vocab, size=(num_items, length))
    item_ids = np.arange(num_items) + 1
    days_ago = rng.integers(0, 365, size=num_items)

    def eligible_index(window_days):
        """Day D's valid set: items uploaded in the last `window_days` days."""
        keep = days_ago < window_days
        return StaticIndex.build(
            semantic_ids[keep], vocab, item_ids=item_ids[keep], on_duplicate_item="first"
        )

    # The model: a decoder (untrained here: the point is the refresh) wrapped
    # in a constrained beam search over day 1's index.
    decoder = CachedTransformerDecoder(vocab, length, context_vocab_size=num_items + 1)
    history = keras.Input((10,), dtype="int32", name="history")
    search = ConstrainedBeamSearch(eligible_index(90), decoder, beam_size=10, num_results=5)
    model = keras.Model(history, search(history))

    with tempfile.TemporaryDirectory() as root:
        base, config = f"{root}/recs", f"{root}/models.config"

        def set_labels(stable, canary):
            write_models_config(
                config,
                [ServedModel("recs", base, versions=sorted({stable, canary}),
                             labels={"stable": stable, "canary": canary})],
            )  # fmt: skip

        # Day 1: version 1, stable and canary.
        publish(model, base, model_name="recs")
        set_labels(stable=1, canary=1)
        with DevServer(config_file=config, poll_seconds=0.2) as server:
            client = GrpcClient(server.grpc_address)
            users = {"history": rng.integers(1, num_items, size=(4, 10)).astype("int32")}

            def ask(label):
                answer = client.predict("recs", users, label=label)
                ages = days_ago[answer["item_ids"][answer["item_ids"] > 0] - 1]
                return answer["model_version"], int(ages.max())

            print("day 1  stable ->", "version %d, oldest item %d days" % ask("stable"))

            # Day 2: a 30-day window goes to canary first.
            day2 = publish(replace_index(model, eligible_index(30)), base, model_name="recs")
            checksum = read_metadata(day2.path)["indexes"][0]["checksum"]
            print(f"day 2  published version {day2.version}, index {checksum[:12]}")
            set_labels(stable=1, canary=day2.version)
            _wait_for_label(client, "canary", day2.version)
            print("day 2  canary ->", "version %d, oldest item %d days" % ask("canary"))
            set_labels(stable=day2.version, canary=day2.version)
            _wait_for_label(client, "stable", day2.version)
            print("day 2  stable ->", "version %d, oldest item %d days" % ask("stable"))

            # Rollback: day 2's window was a mistake; stable goes back to 1.
            set_labels(stable=1, canary=day2.version)
            _wait_for_label(client, "stable", 1)
            version, oldest = ask("stable")
            print("rollback stable ->", f"version {version}, oldest item {oldest} days")
            assert version == 1 and oldest >= 30
            client.close()


def _wait_for_label(client, label, version, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if client.model_status("recs", label=label)[0]["version"] == version:
                status = client.model_status("recs", version=version)[0]
                if status["state"] == "AVAILABLE":
                    return
        except ServingError:  # the label may not exist yet in the server config
            pass
        time.sleep(0.1)
    raise TimeoutError(f"label {label} never reached version {version}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small catalogue (CI)")
    main(parser.parse_args().quick)
