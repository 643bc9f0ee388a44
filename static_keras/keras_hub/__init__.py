"""keras-hub integration: constrained `CausalLM.generate` and a step decoder.

- `ConstrainedSampler`: greedy or top-k `generate()` that only answers with
  members of a string set (`StringIndex`) or a semantic-ID set
  (`StaticIndex`).
- `ConstrainedBeamSampler`: the beam-search counterpart, which reorders the
  cache and the automaton states by parent beam.
- `CausalLMDecoder`: a `CausalLM` as the `decoder(prefix, state)` of
  `static_keras.beam_search`, its KV cache in the state.

This package imports keras-hub (install `keras-hub`); `import static_keras`
never imports it.
"""

try:
    import keras_hub  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("static_keras.keras_hub needs keras-hub: `pip install keras-hub`") from error

from static_keras.keras_hub.causal_lm_decoder import CausalLMDecoder
from static_keras.keras_hub.constrained_beam_sampler import ConstrainedBeamSampler
from static_keras.keras_hub.constrained_sampler import ConstrainedSampler

__all__ = ["CausalLMDecoder", "ConstrainedBeamSampler", "ConstrainedSampler"]
