"""Index builds beyond one machine: the same index from an Apache Beam pipeline.

`build_index_beam` reads semantic IDs from Parquet, TFRecord or CSV shards,
partitions them by their first tokens (independent subtrees), compiles each
partition with the NumPy builder and merges the partitions, level by level,
into one ordinary index file. Needs the `beam` extra
(`pip install 'static-keras[beam]'`); NumPy and Beam only, no backend.
"""

from static_keras.index.beam_build.pipeline import PipelineFailed
from static_keras.index.beam_build.pipeline import build_index_beam

__all__ = ["PipelineFailed", "build_index_beam"]
