"""Baselines for benchmarking constrained decoding against STATIC.

Each is a constraint for `static_keras.beam_search`: an int `length` and
`candidates(log_probs, states, step, dense_top_k)` with the contract of
`ConstrainedDecoding.candidates`, so that the decode loop, the model and the
beam bookkeeping are the same for all and only the constraint differs. The
unconstrained floor is `beam_search(None, ..., length=L)`.

- `CpuTrie`: a Python dict trie queried per row through a host callback
  (GENRE, `prefix_allowed_tokens_fn`). Exact.
- `PPVExact`: a binary search in the sorted valid set for every token of
  every row (Ye et al., AISTATS 2025). Exact.
- `PPVApproximate`: the same search for the top-`num_probe` tokens only.
  Never invalid, may miss sequences.
- `HashBitmap`: a Bloom filter of prefix hashes. Never misses a valid
  sequence, may return invalid ones.
"""

from static_keras.baselines.cpu_trie import CpuTrie
from static_keras.baselines.hash_bitmap import HashBitmap
from static_keras.baselines.ppv_approximate import PPVApproximate
from static_keras.baselines.ppv_exact import PPVExact
from static_keras.baselines.ppv_exact import SortedPrefixKeys

__all__ = ["CpuTrie", "HashBitmap", "PPVApproximate", "PPVExact", "SortedPrefixKeys"]
