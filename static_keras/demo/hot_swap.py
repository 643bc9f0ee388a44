"""Step 7 of `static-keras demo`: publish, serve, and swap the index under load.

Version 1 is exported and published to a development server; version 2
(the same model with a newer freshness window: an index-only refresh) is
published while requests flow. No request may fail, both versions must
answer, and version 2's answers must lie in its window.
"""

from __future__ import annotations

import tempfile
import threading
import time

import numpy as np

from static_keras.demo.demo_failure import DemoFailure


def serve_and_swap(model, newer_index, histories, fresh_days, newer_ids, print_fn) -> dict:
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
