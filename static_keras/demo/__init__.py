"""The main job, `static-keras demo`: generative retrieval end to end."""

from static_keras.demo.demo_failure import DemoFailure
from static_keras.demo.generative_retrieval import run_demo

__all__ = ["DemoFailure", "run_demo"]
