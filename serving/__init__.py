"""TF Serving client, config writers and a development server (`static_keras.serving`).

The client modules import neither Keras nor the layers. Production serves
with `tensorflow_model_server`; `DevServer` is a stand-in for tests and
local use (see its module docstring and docs/serving.md).
"""

from static_keras.serving.client import GrpcClient
from static_keras.serving.client import RestClient
from static_keras.serving.client import ServingError
from static_keras.serving.config import ServedModel
from static_keras.serving.config import read_models_config
from static_keras.serving.config import write_batching_config
from static_keras.serving.config import write_models_config

__all__ = [
    "GrpcClient",
    "RestClient",
    "ServedModel",
    "ServingError",
    "read_models_config",
    "write_batching_config",
    "write_models_config",
]
