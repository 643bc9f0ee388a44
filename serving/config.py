"""Writers for TF Serving's `models.config` and batching parameters files."""

from __future__ import annotations

import dataclasses
import os
import tempfile


@dataclasses.dataclass
class ServedModel:
    """One entry of a `models.config`.

    Attributes:
        name: model name in requests (`/v1/models/NAME`).
        base_path: the directory of integer version directories.
        versions: versions to serve; None serves the latest one.
        labels: version labels, e.g. `{"stable": 3, "canary": 4}`. Each
            labelled version must be in `versions`.
    """

    name: str
    base_path: str
    versions: list[int] | None = None
    labels: dict[str, int] = dataclasses.field(default_factory=dict)

    def check(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"Invalid model name {self.name!r}")
        if self.labels and self.versions is None:
            raise ValueError(
                f"Model {self.name!r}: labels need explicit `versions` (TF Serving only "
                "labels versions served under a 'specific' version policy)"
            )
        for label, version in self.labels.items():
            if version not in (self.versions or []):
                raise ValueError(
                    f"Model {self.name!r}: label {label!r} points at version {version}, "
                    f"which is not served (versions: {self.versions})"
                )


def models_config_proto(models: list[ServedModel]):
    """The `ModelServerConfig` protobuf for `models`."""
    from tensorflow_serving.config import model_server_config_pb2

    config = model_server_config_pb2.ModelServerConfig()
    for model in models:
        model.check()
        entry = config.model_config_list.config.add()
        entry.name = model.name
        entry.base_path = os.path.abspath(model.base_path)
        entry.model_platform = "tensorflow"
        if model.versions is None:
            entry.model_version_policy.latest.num_versions = 1
        else:
            entry.model_version_policy.specific.versions.extend(sorted(model.versions))
        for label, version in sorted(model.labels.items()):
            entry.version_labels[label] = version
    return config


def write_models_config(path: str | os.PathLike, models: list[ServedModel]) -> str:
    """Writes a `--model_config_file` (text protobuf), atomically."""
    from google.protobuf import text_format

    text = text_format.MessageToString(models_config_proto(models))
    _write_atomically(os.fspath(path), text)
    return text


def read_models_config(path: str | os.PathLike) -> list[ServedModel]:
    """Parses a `models.config` written by hand or by `write_models_config`."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    with open(path) as file:
        try:
            config = text_format.Parse(file.read(), model_server_config_pb2.ModelServerConfig())
        except text_format.ParseError as error:
            raise ValueError(f"{os.fspath(path)!r} is not a valid models.config: {error}") from None
    models = []
    for entry in config.model_config_list.config:
        policy = entry.model_version_policy
        versions = list(policy.specific.versions) if policy.HasField("specific") else None
        models.append(
            ServedModel(entry.name, entry.base_path, versions, dict(entry.version_labels))
        )
    return models


def write_batching_config(
    path: str | os.PathLike,
    *,
    max_batch_size: int = 32,
    allowed_batch_sizes: list[int] | None = None,
    batch_timeout_micros: int = 1000,
    num_batch_threads: int | None = None,
    max_enqueued_batches: int = 100,
    pad_variable_length_inputs: bool = False,
) -> str:
    """Writes a `--batching_parameters_file` for `--enable_batching`.

    `allowed_batch_sizes` bound the shapes the server runs (and, with XLA,
    compiles): ascending, ending at `max_batch_size`. Batches are padded up
    to the next allowed size. `pad_variable_length_inputs` pads with the
    first element of each input, not with 0.
    """
    if max_batch_size < 1:
        raise ValueError(f"`max_batch_size` must be positive. Received: {max_batch_size}")
    sizes = allowed_batch_sizes or [max_batch_size]
    if sorted(set(sizes)) != list(sizes) or sizes[0] < 1:
        raise ValueError(f"`allowed_batch_sizes` must be ascending and positive: {sizes}")
    if sizes[-1] != max_batch_size:
        raise ValueError(
            f"`allowed_batch_sizes` must end at max_batch_size={max_batch_size}: {sizes}"
        )
    threads = num_batch_threads or os.cpu_count() or 1
    lines = [
        f"max_batch_size {{ value: {max_batch_size} }}",
        f"batch_timeout_micros {{ value: {batch_timeout_micros} }}",
        f"max_enqueued_batches {{ value: {max_enqueued_batches} }}",
        f"num_batch_threads {{ value: {threads} }}",
        *(f"allowed_batch_sizes: {size}" for size in sizes),
        f"pad_variable_length_inputs: {'true' if pad_variable_length_inputs else 'false'}",
    ]
    text = "\n".join(lines) + "\n"
    _write_atomically(os.fspath(path), text)
    return text


def _write_atomically(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    with os.fdopen(handle, "w") as file:
        file.write(text)
    os.replace(temporary, path)
