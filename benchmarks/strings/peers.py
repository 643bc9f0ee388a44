"""Peer constraint engines, each run in a child process with a time limit.

`python -m benchmarks.strings.peers JOB.json` runs one job and prints one
JSON line. A job names the peer (`xgrammar`, `llguidance`, `outlines`), the
vocabulary (an `.npz` written by `save_vocabulary`), the strings, how many
compiles to time and, optionally, decode paths whose states are masked
(times per batch under each protocol of `protocol`, and the bitmasks for the
differential check).

Each peer is driven with the API facts of DESIGN.md section 6:
- XGrammar: `TokenizerInfo(token bytes, VocabType.RAW, vocab_size=V,
  stop_token_ids=[eos])` with special tokens as `b""`, grammar
  `root ::= "a" | "b" | ...`, `GrammarCompiler(info, cache_enabled=False)`,
  `GrammarMatcher.fill_next_token_bitmask`.
- llguidance: Lark `start: CHOICE`, the alternation split into terminals of
  at most 1,000 literals (one rule of more than 2,000 alternatives hits its
  row limit), `LLMatcher`, `llguidance.numpy.fill_next_token_bitmask`.
- outlines-core: `Vocabulary(eos, {bytes: [ids]})`, `Index(regex, vocab)`
  with the literals in reverse sorted order (its regex alternation is
  leftmost-first: `ab|abc` never matches `abc`), `Guide.write_mask_into`.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

import numpy as np

from benchmarks.strings import protocol

PEERS = ("xgrammar", "llguidance", "outlines")


def save_vocabulary(path: str, token_bytes: list[bytes], special, eos: int) -> None:
    lengths = np.fromiter(map(len, token_bytes), np.int64, len(token_bytes))
    offsets = np.zeros(len(token_bytes) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.frombuffer(b"".join(token_bytes), np.uint8)
    np.savez(path, data=data, offsets=offsets, special=np.asarray(special, bool), eos=eos)


def load_vocabulary(path: str):
    with np.load(path) as archive:
        data = archive["data"].tobytes()
        offsets = archive["offsets"].tolist()
        special = archive["special"].copy()
        eos = int(archive["eos"])
    tokens = [data[a:b] for a, b in zip(offsets, offsets[1:])]
    return tokens, special, eos


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _ebnf_literal(text: str) -> str:
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _regex_literal(text: str) -> str:
    meta = set("\\.+*?()|[]{}^$#&-~ ")
    return "".join("\\" + c if c in meta else c for c in text)


class _Xgrammar:
    def __init__(self, tokens, special, eos):
        import xgrammar

        self.xgr = xgrammar
        encoded = [b"" if special[i] or i == eos else t for i, t in enumerate(tokens)]
        self.info = xgrammar.TokenizerInfo(
            encoded, xgrammar.VocabType.RAW, vocab_size=len(tokens), stop_token_ids=[eos]
        )
        self.batch = None

    def compile(self, strings):
        grammar = "root ::= " + " | ".join(_ebnf_literal(s) for s in strings)
        compiler = self.xgr.GrammarCompiler(self.info, cache_enabled=False)
        return compiler.compile_grammar(grammar)

    def memory(self, compiled) -> int:
        return int(compiled.memory_size_bytes)

    def matcher(self, compiled, prefix):
        matcher = self.xgr.GrammarMatcher(compiled)
        for token in prefix:
            if not matcher.accept_token(int(token)):
                raise RuntimeError(f"xgrammar rejected token {token} of a valid path")
        return matcher

    def fill(self, matcher, bitmask, row):
        matcher.fill_next_token_bitmask(bitmask, row)

    def batch_fill(self, matchers, bitmask):
        if self.batch is None:  # made once: its thread pool is not part of a step
            self.batch = self.xgr.BatchGrammarMatcher(max_threads=os.cpu_count() or 1)
        self.batch.batch_fill_next_token_bitmask(matchers, bitmask)


class _Llguidance:
    def __init__(self, tokens, special, eos):
        import llguidance
        import llguidance.numpy as lnp

        self.ll, self.lnp = llguidance, lnp
        singles = {t[0]: i for i, t in enumerate(tokens) if len(t) == 1 and not special[i]}

        class Tokenizer:
            eos_token_id = eos
            bos_token_id = None
            special_token_ids = [int(i) for i in np.flatnonzero(special)]

            def __call__(self, text):
                data = text.encode() if isinstance(text, str) else text
                return [singles[b] for b in data]

        Tokenizer.tokens = [b"" if special[i] else t for i, t in enumerate(tokens)]
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Tokenizer()))

    def compile(self, strings):
        literals = [json.dumps(s, ensure_ascii=False) for s in strings]
        chunks = [literals[i : i + 1000] for i in range(0, len(literals), 1000)]
        lines = ["start: CHOICE", "CHOICE: " + " | ".join(f"C{i}" for i in range(len(chunks)))]
        lines += [f"C{i}: " + " | ".join(chunk) for i, chunk in enumerate(chunks)]
        grammar = self.ll.LLMatcher.grammar_from_lark("\n".join(lines))
        matcher = self.ll.LLMatcher(self.tokenizer, grammar)
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        return grammar

    def memory(self, compiled) -> int:
        return -1

    def matcher(self, compiled, prefix):
        matcher = self.ll.LLMatcher(self.tokenizer, compiled)
        for token in prefix:
            if not matcher.consume_token(int(token)):
                raise RuntimeError(f"llguidance rejected token {token}: {matcher.get_error()}")
        return matcher

    def fill(self, matcher, bitmask, row):
        self.lnp.fill_next_token_bitmask(matcher, bitmask, row)

    batch_fill = None


class _Outlines:
    def __init__(self, tokens, special, eos):
        import outlines_core

        self.oc = outlines_core
        by_bytes: dict[bytes, list[int]] = {}
        for i, token in enumerate(tokens):
            if token and not special[i] and i != eos:
                by_bytes.setdefault(token, []).append(i)
        self.vocabulary = outlines_core.Vocabulary(eos, by_bytes)

    def compile(self, strings):
        pattern = "(" + "|".join(_regex_literal(s) for s in sorted(strings, reverse=True)) + ")"
        return self.oc.Index(pattern, self.vocabulary)

    def memory(self, compiled) -> int:
        return -1

    def matcher(self, compiled, prefix):
        guide = self.oc.Guide(compiled)
        for token in prefix:
            guide.advance(int(token))
        return guide

    def fill(self, guide, bitmask, row):
        guide.write_mask_into(bitmask[row].ctypes.data, bitmask.shape[1], 4)

    batch_fill = None


_ENGINES = {"xgrammar": _Xgrammar, "llguidance": _Llguidance, "outlines": _Outlines}


def run(job: dict) -> dict:
    tokens, special, eos = load_vocabulary(job["vocab"])
    with open(job["strings"]) as file:
        strings = json.load(file)
    rss_start = _rss_mb()
    start = time.perf_counter()
    engine = _ENGINES[job["peer"]](tokens, special, eos)
    result = {"peer": job["peer"], "vocab_prep_s": time.perf_counter() - start}
    times = []
    compiled = None
    for _ in range(int(job.get("repeats", 1))):
        compiled = None
        start = time.perf_counter()
        compiled = engine.compile(strings)
        times.append(time.perf_counter() - start)
    result["compile_s"] = times
    # Engines that compile lazily (llguidance) pay at the first mask: time it.
    matcher = engine.matcher(compiled, [])
    first = np.zeros((1, (len(tokens) + 31) // 32), np.int32)
    start = time.perf_counter()
    engine.fill(matcher, first, 0)
    result["first_mask_s"] = time.perf_counter() - start
    result["memory_bytes"] = engine.memory(compiled)
    result["peak_rss_mb"] = _rss_mb()
    result["rss_growth_mb"] = _rss_mb() - rss_start
    if job.get("paths"):
        result["timings_ns"], masks = _mask_timings(engine, compiled, job["paths"], len(tokens))
        np.save(job["masks_out"], masks)
    return result


def _mask_timings(engine, compiled, paths_file, vocab_size):
    """Per-step mask times under every protocol and batch size (see
    `protocol`), and the masks of every sampled state (differential check)."""
    with np.load(paths_file) as archive:
        paths, rows, lengths = archive["paths"], archive["rows"], archive["lengths"]
    batches, batch = rows.shape
    words = (vocab_size + 31) // 32
    # Matchers replay each prefix outside any timed region.
    matchers = [
        [engine.matcher(compiled, paths[r, : lengths[b, i]]) for i, r in enumerate(rows[b])]
        for b in range(batches)
    ]
    # One bitmask buffer, written once before timing and reused (as a decode
    # loop does; a fresh np.zeros would add page faults).
    bitmask = np.full((batch, words), -1, np.int32)
    masks = np.zeros((rows.size, words), np.int32)
    for b in range(batches):
        for i, matcher in enumerate(matchers[b]):
            engine.fill(matcher, bitmask, i)
        masks[b * batch : (b + 1) * batch] = bitmask
    timings = {}
    for name in protocol.PROTOCOLS:
        for n in protocol.BATCH_SIZES:
            if n > batch:
                continue

            # Inputs sliced outside the timed region, as for the floor.
            batch_matchers = [matchers[b][:n] for b in range(batches)]
            rows_view = bitmask[:n]

            def per_row(b, batch_matchers=batch_matchers):
                for i, matcher in enumerate(batch_matchers[b]):
                    engine.fill(matcher, bitmask, i)

            timings[f"{name}|{n}|one call per row"] = protocol.time_batches(per_row, batches, name)
            if engine.batch_fill is not None:

                def batch_api(b, batch_matchers=batch_matchers, rows_view=rows_view):
                    engine.batch_fill(batch_matchers[b], rows_view)

                label = f"batch API, {os.cpu_count()} threads"
                timings[f"{name}|{n}|{label}"] = protocol.time_batches(batch_api, batches, name)
    return timings, masks


def main(argv=None, runner=None) -> None:
    """Reads the job file named on the command line, prints `runner(job)` as
    one JSON line (`runner` defaults to this module's `run`)."""
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as file:
        job = json.load(file)
    print(json.dumps((runner or run)(job)), flush=True)


if __name__ == "__main__":
    main()
