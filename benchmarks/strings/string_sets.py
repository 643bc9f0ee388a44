"""String sets for the benchmarks: synthetic product paths and real sets.

- `product_paths`: "Electronics > Computers > ... #123456" strings of about
  50 characters (the setting of the XGrammar figures quoted in the issue),
  deterministic in (k, seed), K as large as asked.
- `botocore`: AWS API operations as `service.Operation` (about 20,000; tool
  names), from the service models botocore ships.
- `unicode`: names of Unicode characters (about 140,000), from `unicodedata`.
- `pycountry`: `Country > Subdivision` (about 5,000, non-ASCII included).

`load(name, k, seed)` returns k distinct strings (a seeded sample when the
set is larger; all of it, shuffled, when smaller).
"""

from __future__ import annotations

import functools
import glob
import gzip
import json
import os
import random
import sys
import unicodedata

_WORDS = (
    "Electronics Computers Laptops Accessories Home Kitchen Garden Outdoor Tools Sports "
    "Fitness Toys Games Books Music Movies Clothing Shoes Jewelry Beauty Health Grocery "
    "Baby Pet Supplies Office Automotive Industrial Scientific Arts Crafts Sewing Luggage "
    "Travel Gear Cameras Photo Video Audio Headphones Speakers Tablets Phones Cases "
    "Chargers Cables Monitors Keyboards Mice Printers Storage Networking"
).split()

NAMES = ("product_paths", "botocore", "unicode", "pycountry")


def product_paths(k: int, seed: int = 0, chars: int = 50) -> list[str]:
    """k distinct category paths of `chars` characters, in a seeded order."""
    rng = random.Random(seed)
    out: set[str] = set()
    while len(out) < k:
        parts: list[str] = []
        while len(" > ".join(parts)) < chars - 8:
            parts.append(rng.choice(_WORDS))
        out.add((" > ".join(parts) + f" #{rng.randrange(10**6)}")[:chars])
    return sorted(out, key=lambda _: rng.random())


@functools.lru_cache(maxsize=1)
def botocore_operations() -> tuple[str, ...]:
    import botocore

    root = os.path.join(os.path.dirname(botocore.__file__), "data")
    newest: dict[str, str] = {}
    for path in glob.glob(os.path.join(root, "*", "*", "service-2.json*")):
        service, version = path.split(os.sep)[-3:-1]
        if service not in newest or version > newest[service].split(os.sep)[-2]:
            newest[service] = path
    names = set()
    for service, path in newest.items():
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as file:
            for operation in json.load(file).get("operations", {}):
                names.add(f"{service}.{operation}")
    return tuple(sorted(names))


@functools.lru_cache(maxsize=1)
def unicode_names() -> tuple[str, ...]:
    names = {unicodedata.name(chr(c), "") for c in range(sys.maxunicode + 1)}
    names.discard("")
    return tuple(sorted(names))


@functools.lru_cache(maxsize=1)
def pycountry_subdivisions() -> tuple[str, ...]:
    import pycountry

    countries = {c.alpha_2: c.name for c in pycountry.countries}
    return tuple(
        sorted({f"{countries[s.country_code]} > {s.name}" for s in pycountry.subdivisions})
    )


def load(name: str, k: int, seed: int = 0) -> list[str]:
    """k strings of the set `name` (see the module docstring)."""
    if name == "product_paths":
        return product_paths(k, seed)
    source = {
        "botocore": botocore_operations,
        "unicode": unicode_names,
        "pycountry": pycountry_subdivisions,
    }[name]()
    rng = random.Random(seed)
    if k >= len(source):
        out = list(source)
        rng.shuffle(out)
        return out
    return rng.sample(source, k)


def size(name: str) -> int | None:
    """How many strings the set holds (None: unbounded)."""
    if name == "product_paths":
        return None
    return len(load(name, 10**9))
