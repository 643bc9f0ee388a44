"""From a job's start to the first answer by the version it publishes, on a served model.

    python -m benchmarks.swap_time --model-base-path BASE --ids IDS.npy \\
        -- refresh-eligibility --model-base-path BASE --set in_stock=NEW.npy

Starts `static-keras serve-dev` on BASE (a lifecycle catalogue: model name
`recs`, the README's decoder, one set), waits until it answers, then keeps
three client threads sending requests (`serving_default` batch 1,
`serving_eligible` batch 1 and 32, 50 ms apart, as `benchmarks/lifecycle.py`
does) while the static-keras command after `--` runs in a fresh process.
Reports the job's seconds and peak RSS, the seconds from its start to the
first answer by the new version, the server's load and warmup (its log),
the slowest request and any failed one during the swap. `--ids`: item ids
of the served catalogue (the excluded ids of the restricted requests).
For a rules change at 10^8 items, which the lifecycle benchmark reaches
only after most of an hour of building.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import job_memory  # noqa: E402
from benchmarks import lifecycle  # noqa: E402
from benchmarks.decoding import common  # noqa: E402


def newest_version(base: str) -> int:
    return max(int(name) for name in os.listdir(base) if name.isdigit())


def server_events(log: str, since: float) -> list[str]:
    """The server's load, swap and unload lines, in seconds from `since`
    (a `time.time()`), to set beside the slow requests."""
    events = []
    for stamp, message in re.findall(
        r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ static_keras\.serving: (.*)$",
        log,
        flags=re.M,
    ):
        when = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if when >= since - 1:
            events.append(f"  server at {when - since:+6.1f} s: {message}")
    return events


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-base-path", required=True)
    parser.add_argument("--ids", required=True, help=".npy of served item ids")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("job", nargs=argparse.REMAINDER, help="-- then the static-keras command")
    args = parser.parse_args(argv)
    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    if not job:
        parser.error("give the static-keras command after --")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import numpy as np

    base = os.path.abspath(args.model_base_path)
    old = newest_version(base)
    requests = lifecycle.Requests(np.random.default_rng(0), np.load(args.ids))
    log = os.path.join(tempfile.mkdtemp(prefix="swap_time_"), "server.log")
    server = lifecycle.ServerProcess(base, log)
    try:
        up = server.wait_until_answering(requests.proto["serving_default", 1], args.timeout)
        print(f"serving version {old}: up in {up:.1f} s "
              f"(loaded and warmed up in {server.load_seconds(old)} s)", flush=True)  # fmt: skip
        load = lifecycle.Load(server.address, requests, threads=3, pause_s=0.05)
        load.start()
        time.sleep(2.0)  # steady traffic before the job
        started, started_wall = time.perf_counter(), time.time()
        job_peak, job_seconds, output = job_memory.run_once(None, job)
        new = newest_version(base)
        while load.first_answer(new) is None:
            server.check_alive()
            if time.perf_counter() - started > args.timeout:
                raise SystemExit(f"version {new} never answered:\n{server.log()[-3000:]}")
            time.sleep(0.02)
        first = load.first_answer(new) - started
        time.sleep(1.0)
        load.stop()
        failed = len(load.failures)
        result = {
            "old": old,
            "new": new,
            "job_s": round(job_seconds, 2),
            "job_peak_mib": round(job_peak),
            "first_answer_s": round(first, 2),
            "server_load_s": server.load_seconds(new),
            "max_latency_ms": round(1e3 * load.max_latency, 1),
            # When the requests above 1 s ended, from the job's start: in the
            # job, the server's load and warmup, or the old version's unload.
            "slow_ends_s": [round(end - started, 1) for end, s in load.timeline if s > 1.0],
            "requests": len(load.answers) + failed,
            "failed": failed,
            "server_rss_mib": round(lifecycle.rss(server.pid) / 2**20),
        }
        print(output.strip()[-800:])
        for line in server_events(server.log(), started_wall):
            print(line)
        print(result)
        print(common.machine_line())
        return result
    finally:
        server.stop()


if __name__ == "__main__":
    main()
