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

from static_keras.tensorflow_log_lines import import_quietly

try:  # TensorFlow's harmless start-up lines filtered
    import_quietly("keras_hub")
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("static_keras.keras_hub needs keras-hub: `pip install keras-hub`") from error

from static_keras.keras_hub.causal_lm_decoder import CausalLMDecoder  # noqa: E402
from static_keras.keras_hub.constrained_beam_sampler import ConstrainedBeamSampler  # noqa: E402
from static_keras.keras_hub.constrained_sampler import ConstrainedSampler  # noqa: E402

__all__ = ["CausalLMDecoder", "ConstrainedBeamSampler", "ConstrainedSampler"]
