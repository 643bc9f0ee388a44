"""TF Serving warmup records: `assets.extra/tf_serving_warmup_requests`.

The server replays these PredictRequests against a new version before it
takes traffic: tracing happens before the swap, and a version that cannot
run fails to load while the old one keeps serving.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from static_keras.index.tfrecord import read_records

WARMUP_FILENAME = "tf_serving_warmup_requests"
MAX_WARMUP_RECORDS = 1000  # TF Serving reads at most this many


def write_warmup_requests(
    path: str,
    *,
    model_name: str,
    signature_name: str,
    examples: dict[str, np.ndarray],
    batch_sizes,
    more_signatures: dict[str, dict[str, np.ndarray]] | None = None,
) -> int:
    """Writes one PredictRequest per batch size (rows tiled from `examples`),
    and as many for each of `more_signatures` ({signature: examples})."""
    from tensorflow_serving.apis import model_pb2
    from tensorflow_serving.apis import predict_pb2
    from tensorflow_serving.apis import prediction_log_pb2

    batch_sizes = [int(b) for b in batch_sizes]
    plan = [(signature_name, examples), *(more_signatures or {}).items()]
    if not batch_sizes or len(batch_sizes) * len(plan) > MAX_WARMUP_RECORDS or min(batch_sizes) < 1:
        raise ValueError(
            f"Warmup needs positive batch sizes, 1 to {MAX_WARMUP_RECORDS} records in all "
            f"({len(plan)} signatures). Received: {batch_sizes}"
        )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for (signature_name, examples), batch_size in (
            (entry, size) for entry in plan for size in batch_sizes
        ):
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature_name)
            )
            for name, example in examples.items():
                example = np.asarray(example)
                rows = np.resize(example, (batch_size, *example.shape[1:]))
                request.inputs[name].CopyFrom(tf.make_tensor_proto(rows))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)
            )
            writer.write(log.SerializeToString())
    return len(batch_sizes) * len(plan)


def read_warmup_requests(path: str) -> list:
    """The PredictRequests of a warmup file (for tests and the dev server).

    Read without `tf.data` (`TFRecordDataset` logs a buffer-size note on
    every read, whatever it is given); framing and CRCs are checked."""
    from tensorflow_serving.apis import prediction_log_pb2

    requests = []
    with open(path, "rb") as file:
        for record in read_records(file, path):
            if len(requests) == MAX_WARMUP_RECORDS:
                break
            log = prediction_log_pb2.PredictionLog.FromString(record)
            requests.append(log.predict_log.request)
    return requests
