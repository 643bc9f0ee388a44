"""Soak of overlapping publishing jobs under a paced client (docs/serving.md, "When jobs overlap").

The day in production with its jobs overlapping, run with the public CLI on
one host: `static-keras serve-dev` polls the base path every second; a paced
one-thread client sends `serving_eligible` requests (set 0 or 1, three
excluded item ids) every `--pause-ms`; for `--seconds`, two rules loops
(sets `in_stock` and `fr`) run `static-keras refresh-eligibility` at random
intervals, each with a random half of the first catalogue's items, while
two catalogue jobs (`static-keras publish model.keras --index ...`, each
replacing 1% of the items) start at random times and overlap them and each
other. Every version is kept (`--keep 100000`) so each can be checked.

What is checked, from outside, after the jobs end:
- every job ended with exit code 0 (none lost its change or died);
- every version holds, per set, the rule of the last rules job published
  at or below it (or the first version's set) over its catalogue, and the
  catalogue of the last catalogue job published at or below it: no change
  was ever rolled back, the newest holds the last of each;
- 0 failed requests, and every answer is eligible under the version that
  answered (in its catalogue, in the request's set, not excluded).

    python benchmarks/overlapping_jobs.py --items 2e7 --seconds 240   # by hand
    python benchmarks/overlapping_jobs.py --items 2000 --seconds 60   # the slow CI test

Prints a summary and writes benchmarks/results/overlapping_jobs.csv (one
row per job, then the summary) unless `--csv ''`.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks import lifecycle  # noqa: E402
from benchmarks.decoding import common  # noqa: E402

SETS = ("in_stock", "fr")
KEEP_ALL = "100000"


def _command() -> list[str]:
    executable = os.path.join(os.path.dirname(sys.executable), "static-keras")
    return (
        [executable] if os.path.exists(executable) else [sys.executable, "-m", "static_keras.cli"]
    )


def set_up(workdir: str, n: int, seed: int) -> dict:
    """The first catalogue and version 1 (a small decoder, both sets), and
    two catalogue changes of 1% each, as index files."""
    import keras

    from static_keras import CachedTransformerDecoder
    from static_keras import ConstrainedBeamSearch
    from static_keras import ConstrainedDecoding
    from static_keras import StaticIndex
    from static_keras.export import publish
    from static_keras.index.eligibility import EligibilitySets

    rng = np.random.default_rng(seed)
    rows, keys = lifecycle.distinct_ids(n, seed)
    ids = 10**9 + 2 * rng.permutation(n).astype(np.int64)
    first = StaticIndex.build(rows, lifecycle.VOCAB, item_ids=ids)
    sets = EligibilitySets.build(
        first, {name: rng.choice(ids, n // 2, replace=False) for name in SETS}
    )
    keras.utils.set_random_seed(seed)
    decoder = CachedTransformerDecoder(
        lifecycle.VOCAB, lifecycle.LENGTH, context_vocab_size=lifecycle.CONTEXT_VOCAB,
        hidden_dim=16,
    )  # fmt: skip
    layer = ConstrainedDecoding(first, eligibility=sets, name="constraint")
    search = ConstrainedBeamSearch(constraint=layer, decoder=decoder, beam_size=8)
    history = keras.Input((lifecycle.HISTORY,), dtype="int32", name="history")
    model = keras.Model(history, search(history))
    model_path = os.path.join(workdir, "model.keras")
    model.save(model_path)
    base = os.path.join(workdir, "recs")
    publish(model, base, keep=None, warmup_batch_sizes=(1,), model_name=lifecycle.MODEL)

    catalogues, taken = [], np.sort(keys)
    for change in (1, 2):  # each replaces 1% of the previous catalogue
        replaced = rng.choice(n, max(1, n // 100), replace=False)
        new_rows, new_keys = lifecycle.distinct_ids(len(replaced), seed + change, taken)
        taken = np.sort(np.concatenate([taken, new_keys]))
        rows, ids = rows.copy(), ids.copy()
        rows[replaced] = new_rows
        ids[replaced] = 3 * 10**9 + change * n + np.arange(len(replaced))
        path = os.path.join(workdir, f"catalogue_{change}.npz")
        StaticIndex.build(rows, lifecycle.VOCAB, item_ids=ids).save(path)
        catalogues.append((path, np.sort(ids)))
    first_item_ids = np.sort(first_ids(first))
    del model, search, layer, first, sets
    keras.backend.clear_session()  # the soak's process holds no index while jobs run
    return {"model": model_path, "base": base, "first_ids": first_item_ids,
            "catalogues": catalogues}  # fmt: skip


def first_ids(index) -> np.ndarray:
    from static_keras.index.eligibility import MemberCatalogue

    return MemberCatalogue.from_index(index).item_ids


def run_job(kind: str, args: list[str], payload, jobs: list, lock: threading.Lock) -> None:
    start = time.time()
    done = subprocess.run(
        _command() + args, capture_output=True, text=True, env=lifecycle.child_env()
    )
    found = re.search(r"published version (\d+)", done.stdout)
    rebases = re.search(r"rebased onto version \d+ \(versions \[([0-9, ]+)\]", done.stdout)
    with lock:
        jobs.append({
            "kind": kind, "start": start, "end": time.time(), "rc": done.returncode,
            "version": int(found[1]) if found else None, "payload": payload,
            "error": done.stderr.strip().splitlines()[-1:] if done.returncode else [],
            "rebased": len(rebases[1].split(",")) if rebases else 0,
        })  # fmt: skip


class PacedClient:
    """One thread, one request in flight, `pause_s` between two."""

    def __init__(self, address: str, pause_s: float, candidates: np.ndarray, seed: int):
        self.address, self.pause_s = address, pause_s
        self.rng = np.random.default_rng(seed)
        self.candidates = candidates
        self.answers, self.failures = [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        from static_keras.serving import GrpcClient
        from static_keras.serving import ServingError

        with GrpcClient(self.address, timeout=30) as client:
            while not self.stop.is_set():
                set_id = np.array([self.rng.integers(0, len(SETS))], np.int32)
                excluded = self.rng.choice(self.candidates, (1, 3)).astype(np.int64)
                history = self.rng.integers(0, lifecycle.CONTEXT_VOCAB, (1, lifecycle.HISTORY))
                inputs = {"history": history.astype(np.int32), "set_id": set_id,
                          "excluded_item_ids": excluded}  # fmt: skip
                started = time.perf_counter()
                try:
                    out = client.predict(lifecycle.MODEL, inputs, signature="serving_eligible")
                    self.answers.append((int(out["model_version"]), int(set_id[0]),
                                         excluded[0], out["item_ids"][0],
                                         time.perf_counter() - started))  # fmt: skip
                except ServingError as error:
                    self.failures.append(str(error))
                time.sleep(self.pause_s)


def wait_first_answer(address: str, timeout: float = 300) -> None:
    from static_keras.serving import GrpcClient
    from static_keras.serving import ServingError

    deadline = time.monotonic() + timeout
    with GrpcClient(address, timeout=10) as client:
        while True:
            try:
                client.model_status(lifecycle.MODEL)
                return
            except (ServingError, Exception):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def soak(setup: dict, workdir: str, seconds: float, pause_ms: float, seed: int) -> dict:
    rng = random.Random(seed)
    base, jobs, lock = setup["base"], [], threading.Lock()
    server = lifecycle.ServerProcess(base, os.path.join(workdir, "server.log"))
    try:
        wait_first_answer(server.address)
        client = PacedClient(server.address, pause_ms / 1000, setup["first_ids"], seed)
        client.thread.start()
        deadline = time.monotonic() + seconds

        def rules_loop(name: str, loop_seed: int):
            loop_rng = np.random.default_rng(loop_seed)
            count = 0
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(0.0, 3.0))
                ids = loop_rng.choice(setup["first_ids"], len(setup["first_ids"]) // 2,
                                      replace=False)  # fmt: skip
                path = os.path.join(workdir, f"{name}_{count}.npy")
                np.save(path, ids)
                count += 1
                run_job("rules", ["refresh-eligibility", "--model-base-path", base, "--set",
                                  f"{name}={path}", "--keep", KEEP_ALL],
                        (name, path), jobs, lock)  # fmt: skip

        def catalogue_job(number: int, delay: float):
            time.sleep(delay)
            path, _ = setup["catalogues"][number]
            run_job("catalogue", ["publish", setup["model"], "--model-base-path", base,
                                  "--index", path, "--keep", KEEP_ALL,
                                  "--warmup-batch-sizes", "1", "--model-name", lifecycle.MODEL],
                    number, jobs, lock)  # fmt: skip

        threads = [threading.Thread(target=rules_loop, args=(name, seed + i))
                   for i, name in enumerate(SETS)]  # fmt: skip
        threads += [threading.Thread(target=catalogue_job, args=(k, rng.uniform(0, seconds / 3)))
                    for k in range(2)]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        final = max(job["version"] or 0 for job in jobs)
        wait_for_version(client, final, timeout=600)
        client.stop.set()
        client.thread.join()
    finally:
        server.stop()
    summary = check(setup, jobs, client)
    summary.update(critical_section(base, setup["first_ids"], seed))
    return summary


def critical_section(base: str, ids: np.ndarray, seed: int, repeats: int = 5) -> dict:
    """How long a job holds the publishing lock: `repeats` in-process rules
    refreshes with the lock timed (the rename's and the record's; the rest
    of the job runs unlocked)."""
    import contextlib

    from static_keras.export import refresh_eligibility
    from static_keras.export import staging
    from static_keras.export import version_checks
    from static_keras.export import version_lock

    # Every user of the lock: the publishing rule and the verdict record.
    modules = (staging, version_checks)
    held = []

    @contextlib.contextmanager
    def timed_lock(*args, **kwargs):
        with version_lock.version_lock(*args, **kwargs):
            start = time.perf_counter()
            yield
            held.append(time.perf_counter() - start)

    rng = np.random.default_rng(seed)
    for module in modules:
        module.version_lock = timed_lock
    try:
        jobs = []
        for _ in range(repeats):
            start = time.perf_counter()
            refresh_eligibility(base, {SETS[0]: rng.choice(ids, len(ids) // 2)}, keep=None)
            jobs.append(time.perf_counter() - start)
    finally:
        for module in modules:
            module.version_lock = version_lock.version_lock
    return {
        "lock_held_ms_p50": round(1000 * float(np.median(held)), 2),
        "lock_held_ms_max": round(1000 * max(held), 2),
        "refresh_in_process_s_p50": _median(jobs),
    }


def wait_for_version(client: PacedClient, version: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(answer[0] >= version for answer in client.answers[-5:]):
            return
        time.sleep(0.2)


def check(setup: dict, jobs: list, client: PacedClient) -> dict:
    """Each version against the jobs' log; each answer against its version.
    Vectorised and cached by rule and catalogue (at 2x10^7 a set holds 10^7
    items and there are dozens of versions)."""
    from static_keras.export import list_versions
    from static_keras.export import read_eligibility
    from static_keras.index.eligibility import EligibilitySets

    base = setup["base"]
    versions = list_versions(base)
    by_version = {}
    for answer in client.answers:
        by_version.setdefault(answer[0], []).append(answer)
    first = read_eligibility(os.path.join(base, str(versions[0])))
    expected = {name: (("first", name), _members(first, name)) for name in SETS}
    expected_catalogue = first.catalogue.item_ids
    published = sorted((job for job in jobs if job["rc"] == 0), key=lambda job: job["version"])
    wrong_versions, wrong_answers, rows, catalogues = [], 0, {}, {}
    for version in versions:
        for job in [job for job in published if job["version"] == version]:
            if job["kind"] == "rules":
                name, path = job["payload"]
                expected[name] = ((path, name), np.load(path))
            else:  # items the old catalogue lacked are new here: in no set (carried by id)
                old = np.sort(expected_catalogue)
                expected = {name: ((key, "after", job["payload"]), ids[_inside(old, ids)])
                            for name, (key, ids) in expected.items()}  # fmt: skip
                expected_catalogue = setup["catalogues"][job["payload"]][1]
        held = read_eligibility(os.path.join(base, str(version)))
        fingerprint = held.catalogue.fingerprint
        if fingerprint not in catalogues:
            catalogues[fingerprint] = np.array_equal(
                np.sort(held.catalogue.item_ids), np.sort(expected_catalogue)
            )
        ok = catalogues[fingerprint]
        for name in SETS:
            key, ids = expected[name]
            if (key, fingerprint) not in rows:
                rows[key, fingerprint] = EligibilitySets.build(held.catalogue, {name: ids}).words[0]
            ok &= np.array_equal(held.words[held.set_id(name)], rows[key, fingerprint])
        if not ok:
            wrong_versions.append(version)
        for _, set_id, excluded, items, _ in by_version.get(version, []):
            found = items[items >= 0]
            members = held.catalogue._members_or_absent(found)
            inside = (members >= 0).all() and held.contains(set_id, members).all()
            wrong_answers += int(not inside or np.isin(found, excluded).any())
    latencies = np.array([answer[4] for answer in client.answers]) * 1000
    rules = [job for job in jobs if job["kind"] == "rules"]
    catalogue_jobs = [job for job in jobs if job["kind"] == "catalogue"]
    return {
        "versions": len(versions),
        "rules_jobs": len(rules),
        "catalogue_jobs": len(catalogue_jobs),
        "failed_jobs": sum(job["rc"] != 0 for job in jobs),
        "job_errors": [job["error"] for job in jobs if job["rc"] != 0],
        "rebased_jobs": sum(job["rebased"] > 0 for job in jobs),
        "rebases_per_catalogue_job": [job["rebased"] for job in catalogue_jobs],
        "wrong_versions": wrong_versions,
        "answers": len(client.answers),
        "failed_requests": len(client.failures),
        "wrong_answers": wrong_answers,
        "answer_versions": sorted(by_version),
        "p50_ms": round(float(np.median(latencies)), 1) if len(latencies) else None,
        "max_ms": round(float(latencies.max()), 1) if len(latencies) else None,
        "rules_job_p50_s": _median([job["end"] - job["start"] for job in rules]),
        "catalogue_job_s": [round(job["end"] - job["start"], 1) for job in catalogue_jobs],
        "jobs": jobs,
    }


def _inside(sorted_ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    at = np.minimum(np.searchsorted(sorted_ids, values), len(sorted_ids) - 1)
    return sorted_ids[at] == values


def _median(values):
    return round(float(np.median(values)), 2) if values else None


def _members(sets, name) -> np.ndarray:
    inside = sets.contains(sets.set_id(name), np.arange(sets.num_members))
    return sets.catalogue.item_ids[inside]


def write_csv(path: str, summary: dict, n: int) -> None:
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["n", "kind", "payload", "rc", "version", "seconds", "rebased"])
        for job in sorted(summary["jobs"], key=lambda job: job["start"]):
            payload = job["payload"][0] if job["kind"] == "rules" else job["payload"] + 1
            writer.writerow([n, job["kind"], payload, job["rc"], job["version"],
                             round(job["end"] - job["start"], 2), job["rebased"]])  # fmt: skip
        for key, value in summary.items():
            if key != "jobs":
                writer.writerow([n, "summary", key, json.dumps(value)])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=float, default=2000, help="catalogue size N")
    parser.add_argument("--seconds", type=float, default=60, help="how long the rules loops run")
    parser.add_argument("--pause-ms", type=float, default=50, help="client pause between requests")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", default=os.path.join(common.REPO, "benchmarks", "results",
                                                      "overlapping_jobs.csv"))  # fmt: skip
    args = parser.parse_args(argv)
    n = int(args.items)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    with tempfile.TemporaryDirectory(prefix="overlapping_jobs_") as workdir:
        started = time.perf_counter()
        setup = set_up(workdir, n, args.seed)
        print(f"set up N={n:,} in {time.perf_counter() - started:.1f} s", flush=True)
        summary = soak(setup, workdir, args.seconds, args.pause_ms, args.seed)
    if args.csv:
        write_csv(args.csv, summary, n)
    for key, value in summary.items():
        if key != "jobs":
            print(f"{key:>18}: {value}")
    return summary


if __name__ == "__main__":
    summary = main()
    bad = summary["failed_jobs"] or summary["wrong_versions"] or summary["failed_requests"]
    sys.exit(1 if bad or summary["wrong_answers"] else 0)
