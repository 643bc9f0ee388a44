"""`demo`, `export`, `publish` and `refresh-eligibility`: a model with its
index, as a SavedModel and as a served version."""

from __future__ import annotations

import os

from static_keras.cli.index_commands import load_array
from static_keras.cli.index_commands import load_index
from static_keras.cli.output import UserError


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


def _load_model(path: str):
    from static_keras import saving

    if not os.path.isfile(path):
        raise UserError(f"no such model file: {path}")
    return saving.load_model(path)


def _model_with_index(args, model_base_path=None):
    """The model, over `--index` when given. Its eligibility sets come with
    it: those of the newest good version under `model_base_path` (the rules
    live in the served version; refreshes never touch the .keras file), or
    else the model's own, carried over to the new index by item id."""
    from static_keras.export import replace_index
    from static_keras.export.model_layers import beam_searches

    # The index first: a wrong --index fails in a moment, not after the model loads.
    index = load_index(args.index) if args.index else None
    model = _load_model(args.model)
    if index is None:
        return model
    searches = beam_searches(model)
    constraint = searches[0].constraint if len(searches) == 1 else None
    sets, source = None, "the model"
    if constraint is not None and constraint.num_eligibility_sets:
        served = _served_sets(model_base_path)
        if served is not None:
            source, sets = f"version {served[0]}", served[1]
        else:
            sets = constraint.eligibility_sets()
    try:
        carried = None if sets is None else sets.carried_over(index)
        model = replace_index(model, index, eligibility=carried)
    except ValueError as error:
        raise UserError(str(error)) from None
    if carried is not None:
        before, after = sets.sizes(), carried.sizes()
        counts = ", ".join(f"{name} {before[name]:,} -> {after[name]:,}" for name in carried.names)
        print(f"eligibility sets of {source} carried over to the new index by item id: {counts}")
    return model


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


def command_export(args) -> None:
    from static_keras.export import export_saved_model

    info = export_saved_model(
        _model_with_index(args),
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
    from static_keras.export import publish

    info = publish(
        _model_with_index(args, args.model_base_path),
        args.model_base_path,
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
    print(f"published version {info.version} at {info.path} in {info.seconds:.1f} s{removed}")


def command_refresh_eligibility(args) -> None:
    from static_keras.export import refresh_eligibility

    sets = {}
    for spec in args.set:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UserError(f"--set must be NAME=FILE (item ids, .npy/.csv/.parquet); got {spec!r}")
        sets[name] = load_array(path, args.column).reshape(-1)
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
    )
