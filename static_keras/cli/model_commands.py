"""`demo`, `export`, `publish`, `refresh-eligibility` and `update-catalogue`: a model with its
index, as a SavedModel and as a served version."""

from __future__ import annotations

import contextlib
import os

from static_keras.cli.index_commands import load_array
from static_keras.cli.index_commands import load_index
from static_keras.cli.output import UserError
from static_keras.progress import stage


def command_demo(args) -> None:
    if args.strings:
        import importlib.util

        missing = [m for m in ("botocore", "tokenizers") if importlib.util.find_spec(m) is None]
        if missing:
            raise UserError(
                f"demo --strings needs {' and '.join(missing)}: "
                "pip install 'static-keras[strings-demo]'"
            )
        from static_keras.demo.string_answers import run_strings_demo

        run_strings_demo(args.out or "static_keras_strings_demo", quick=args.quick, seed=args.seed)
        return
    from static_keras.demo import run_demo

    run_demo(args.out or "static_keras_demo", quick=args.quick, seed=args.seed,
             serve=not args.no_serve)  # fmt: skip


def check_is_model(path: str, command: str) -> None:
    """UserError naming what `path` is when it is not a .keras model (an
    index archive given in the model's place, a plain array), and the
    command line that was meant."""
    import zipfile

    if not zipfile.is_zipfile(path):
        raise UserError(f"{path}: not a .keras model (save one with model.save('model.keras'))")
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
    if {"config.json", "metadata.json"} <= names:
        return
    if names and all(name.endswith(".npy") for name in names):
        raise UserError(
            f"{path} is an index or array archive, not a model: the model (.keras) comes "
            f"first and the index after --index, e.g. static-keras {command} model.keras "
            f"--index {path}" + (" --model-base-path models/recs" if command == "publish" else "")
        )
    raise UserError(f"{path}: not a .keras model (a zip without Keras's config.json)")


def _load_model(path: str, carry_sets: bool | None = None):
    """The model at `path`; with `carry_sets` (a bool) without its index,
    which a new one replaces (`load_model_without_index`)."""
    from static_keras import saving
    from static_keras.export.refresh import load_model_without_index

    if not os.path.isfile(path):
        raise UserError(f"no such model file: {path}")
    if carry_sets is None:
        return saving.load_model(path)
    return load_model_without_index(path, carry_sets=carry_sets)


def _model_with_index(args, model_base_path=None):
    """`(model, based_on)`: the model, over `--index` when given. Its
    eligibility sets come with it: those of the newest good version under
    `model_base_path` (the rules live in the served version; refreshes
    never touch the .keras file), carried over to the model's index by item
    id, or else the model's own. `based_on`: the version they came from
    (what `publish` rebases from when versions land meanwhile), or None."""
    from static_keras.export import replace_index
    from static_keras.export.model_layers import beam_searches

    # The index first: a wrong --index fails in a moment, not after the model loads.
    index = None
    if args.index:
        with stage(f"loading {args.index}"):
            index = load_index(args.index)
    served = _served_sets(model_base_path)
    with stage(f"loading {args.model}"):
        # A model whose index is replaced leaves it unread, save what carries
        # its sets over where no served version has any.
        model = _load_model(args.model, None if index is None else served is None)
    searches = beam_searches(model)
    constraint = searches[0].constraint if len(searches) == 1 else None
    sets, source, based_on = None, "the model", None
    if constraint is not None and constraint.num_eligibility_sets:
        if served is not None:
            based_on, sets = served
            source = f"version {based_on}"
        elif index is not None:
            sets = constraint.eligibility_sets()
    if index is None and sets is None:
        return model, based_on
    try:
        target = index if index is not None else constraint.catalogue()
        carried = None if sets is None else sets.carried_over(target)
        if index is not None:
            with stage("the model over the new index (replace_index)"):
                model = replace_index(model, index, eligibility=carried)
        else:
            constraint.set_eligibility(carried)
    except ValueError as error:
        raise UserError(str(error)) from None
    if carried is not None:
        before, after = sets.sizes(), carried.sizes()
        counts = ", ".join(f"{name} {before[name]:,} -> {after[name]:,}" for name in carried.names)
        where = "the new index" if index is not None else "the model's index"
        print(f"eligibility sets of {source} carried over to {where} by item id: {counts}")
    return model, based_on


def _served_sets(model_base_path):
    """`(version, EligibilitySets)` of the newest good version under
    `model_base_path` that holds sets, or None."""
    if not model_base_path or not os.path.isdir(model_base_path):
        return None
    from static_keras.export import read_eligibility
    from static_keras.export import read_metadata
    from static_keras.export.publish import newest_good_version

    version = newest_good_version(model_base_path)
    if version is None:
        return None
    path = os.path.join(model_base_path, str(version))
    if not read_metadata(path).get("eligibility"):
        return None
    return version, read_eligibility(path)


@contextlib.contextmanager
def _publishing(what: str):
    """A job that fails on the file system (disk full, permissions) ends in
    one line: nothing became visible, and the next job removes what it left."""
    try:
        yield
    except OSError as error:
        raise UserError(
            f"{what} failed: {error.strerror or error} ({error.filename or ''}); nothing "
            "was published, and the next publish removes what this one left"
        ) from None


def command_export(args) -> None:
    from static_keras.export import export_saved_model

    info = export_saved_model(
        _model_with_index(args)[0],
        args.out,
        xla=args.xla,
        warmup_batch_sizes=tuple(args.warmup_batch_sizes),
        model_name=args.model_name,
    )
    print(
        f"exported {info.path} in {info.seconds:.1f} s: inputs {list(info.input_names)}, "
        f"outputs {list(info.output_names)}, {info.num_variables} variables, "
        f"{info.variable_bytes:,} bytes"
    )


def command_publish(args) -> None:
    from static_keras.export import HandedOver
    from static_keras.export import publish

    model, based_on = _model_with_index(args, args.model_base_path)
    # Nothing else holds the model: `publish` frees it, and the index its
    # weights share, once exported (before loading the export to check it).
    model = HandedOver(model)
    with _publishing("publishing"):
        info = publish(
            model,
            args.model_base_path,
            based_on=based_on,
            version=args.version,
            keep=args.keep,
            xla=args.xla,
            warmup_batch_sizes=tuple(args.warmup_batch_sizes),
            model_name=args.model_name,
        )
    removed = f", removed {list(info.removed_versions)}" if info.removed_versions else ""
    for version, path in zip(info.quarantined_versions, info.quarantined_paths):
        removed += f"; version {version} does not load: moved to {path}"
    stuck = sorted(set(info.rejected_versions) - set(info.quarantined_versions))
    if stuck:
        removed += f"; versions {stuck} do not load and could not be moved out"
    if info.removed_leftovers:
        removed += f"; removed leftovers {list(info.removed_leftovers)}"
    print(
        f"published version {info.version} at {info.path} in {info.seconds:.1f} s{removed}"
        f"{_rebased(info.rebased_onto)}"
    )


def command_refresh_eligibility(args) -> None:
    from static_keras.export import refresh_eligibility

    sets = {}
    for spec in args.set:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UserError(f"--set must be NAME=FILE (item ids, .npy/.csv/.parquet); got {spec!r}")
        sets[name] = load_array(path, args.column).reshape(-1)
    with _publishing("the refresh"):
        info = refresh_eligibility(
            args.model_base_path,
            sets,
            source_version=args.source_version,
            version=args.version,
            keep=args.keep,
        )
    removed = f", removed {list(info.removed_versions)}" if info.removed_versions else ""
    for version, path in zip(info.quarantined_versions, info.quarantined_paths):
        removed += f"; version {version} does not load: moved to {path}"
    sizes = ", ".join(f"{name} {size:,}" for name, size in info.sizes.items())
    print(
        f"published version {info.version} (sets of version {info.source_version} replaced: "
        f"{sizes} members) at {info.path} in {info.seconds:.2f} s{removed}"
        f"{_rebased(info.rebased_onto)}"
    )


def command_update_catalogue(args) -> None:
    from static_keras.export import update_catalogue

    if not (args.add or args.remove):
        raise UserError("update-catalogue needs --add, --remove or both")
    sequences = item_ids = removed = None
    if args.add:
        sequences, item_ids = _added_items(args.add, args.add_item_ids)
    if args.remove:
        removed = load_array(args.remove, "item_id").reshape(-1)
    joined = {}
    for spec in args.add_to_set or ():
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UserError(f"--add-to-set must be NAME=FILE (item ids); got {spec!r}")
        joined[name] = load_array(path, "item_id").reshape(-1)
    with _publishing("the catalogue update"):
        info = update_catalogue(
            args.model_base_path,
            add_sequences=sequences,
            add_item_ids=item_ids,
            remove_item_ids=removed,
            add_to_sets=joined or None,
            on_duplicate_item=args.on_duplicate_item,
            base_fingerprint=args.base_fingerprint,
            source_version=args.source_version,
            version=args.version,
            keep=args.keep,
        )
    removed_versions = f", removed {list(info.removed_versions)}" if info.removed_versions else ""
    print(
        f"published version {info.version} (version {info.source_version} with {info.added:,} "
        f"items added, {info.removed:,} removed: {info.num_items:,} items) at {info.path} in "
        f"{info.seconds:.2f} s{removed_versions}{_rebased(info.rebased_onto)}; catalogue "
        f"{info.catalogue_fingerprint}"
    )


def _added_items(path: str, ids_path: str | None):
    """`(semantic ids [k, L], item ids [k])` of an --add file: .npz with
    `semantic_ids` and `item_ids`, .parquet with an `item_id` column and one
    column per token, or .npy/.csv semantic ids with --add-item-ids."""
    import numpy as np

    if path.endswith(".npz"):
        if not os.path.isfile(path):
            raise UserError(f"no such file: {path}")
        with np.load(path, allow_pickle=False) as data:
            missing = {"semantic_ids", "item_ids"} - set(data.files)
            if missing:
                raise UserError(f"{path}: no array {sorted(missing)[0]!r} (has {data.files})")
            return data["semantic_ids"], data["item_ids"]
    sequences = load_array(path)
    if path.endswith(".parquet"):
        return sequences, load_array(path, "item_id").reshape(-1)
    if not ids_path:
        raise UserError("--add with .npy/.csv semantic ids needs --add-item-ids FILE")
    return sequences, load_array(ids_path).reshape(-1)


def _rebased(versions) -> str:
    if not versions:
        return ""
    return (
        f"; rebased onto version {versions[-1]} (versions {list(versions)} were published "
        "while it ran; their changes are kept)"
    )
