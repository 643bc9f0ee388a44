"""Op histograms and answers of an exported model's signatures, for one tree.

    python -m benchmarks.decoding.served_ops --tree PATH > a.json
    python -m benchmarks.decoding.served_ops --compare a.json b.json

`program_ops` compares the decode a backend runs; this compares what TF
Serving runs: `serving_default` and `serving_eligible` of one small model
(3,000 items, two eligibility sets, the reference decoder), exported with
and without XLA by `--tree`'s own code (its `static_keras`, `export/` and
`serving/`: a checkout or `git worktree` of any commit), as the op histogram
of each signature's graph (its functions included) and the answer to one
request. A refactor of the export changes neither.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile

from benchmarks.decoding.program_ops import compare as compare_histograms


def _use_tree(tree: str) -> None:
    """Imports static_keras, static_keras.export and .serving from `tree`."""
    tree = os.path.abspath(tree)
    sys.path.insert(0, tree)
    # An editable install maps static_keras.export/.serving to this checkout's
    # folders: drop its finder, and read them from the tree instead.
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    for name in [m for m in sys.modules if m.split(".")[0] == "static_keras"]:
        del sys.modules[name]
    import static_keras

    static_keras.__path__.append(tree)  # export/ and serving/ sit at the top of a tree
    import static_keras.export

    for module in (static_keras, static_keras.export):
        if not module.__file__.startswith(tree):
            raise RuntimeError(f"{module.__name__} came from {module.__file__}, not {tree}")


def signatures(tree: str) -> dict:
    os.environ["KERAS_BACKEND"] = "tensorflow"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    _use_tree(tree)
    import keras
    import numpy as np
    import tensorflow as tf

    from static_keras import CachedTransformerDecoder
    from static_keras import ConstrainedBeamSearch
    from static_keras import ConstrainedDecoding
    from static_keras import StaticIndex
    from static_keras.export import export_saved_model
    from static_keras.index.eligibility import EligibilitySets
    from static_keras.index.eligibility import MemberCatalogue

    rng = np.random.default_rng(0)
    rows = rng.integers(0, 64, size=(3000, 4))
    item_ids = rng.permutation(3000) * 7 + 5
    index = StaticIndex.build(
        rows, 64, item_ids=item_ids, dense_levels=1, on_duplicate_item="first"
    )
    ids = MemberCatalogue.from_index(index).item_ids
    sets = EligibilitySets.build(index, {"a": ids[::3], "b": ids[::5]})
    keras.utils.set_random_seed(0)
    decoder = CachedTransformerDecoder(64, 4, context_vocab_size=50, hidden_dim=16)
    constraint = ConstrainedDecoding(index, eligibility=sets, name="constraint")
    search = ConstrainedBeamSearch(constraint=constraint, decoder=decoder, beam_size=4)
    history = keras.Input((5,), dtype="int32", name="history")
    model = keras.Model(history, search(history))
    request = {
        "history": tf.constant(np.arange(10).reshape(2, 5).astype(np.int32)),
        "set_id": tf.constant([0, -1], tf.int32),
        "excluded_item_ids": tf.constant(np.stack([ids[:3], ids[3:6]]).astype(np.int64)),
    }
    out = {}
    for xla in (False, True):
        path = os.path.join(tempfile.mkdtemp(), "model")
        export_saved_model(model, path, xla=xla, warmup_batch_sizes=(1,))
        loaded = tf.saved_model.load(path)
        for name, function in sorted(loaded.signatures.items()):
            graph = function.graph.as_graph_def()
            ops = [n.op for n in graph.node]
            ops += [n.op for f in graph.library.function for n in f.node_def]
            out[f"{name} xla={xla}"] = dict(collections.Counter(ops))
            inputs = {
                k: v for k, v in request.items() if k in function.structured_input_signature[1]
            }
            answer = function(**inputs)
            out[f"{name} xla={xla}: answer"] = {
                k: np.asarray(v).round(4).tolist() for k, v in sorted(answer.items())
            }
    return out


def compare(a: dict, b: dict) -> None:
    if sorted(a) != sorted(b):
        print(f"signatures differ: {sorted(a)} against {sorted(b)}")
    answers = [k for k in a if k.endswith(": answer")]
    compare_histograms(
        {k: a[k] for k in a if k not in answers}, {k: b[k] for k in b if k not in answers}
    )
    for key in answers:
        print(f"{key}: {'the same' if a[key] == b.get(key) else 'DIFFERENT'}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=".", help="checkout whose code exports the model")
    parser.add_argument("--compare", nargs=2, metavar="JSON")
    args = parser.parse_args(argv)
    if args.compare:
        compare(*(json.load(open(path)) for path in args.compare))
        return
    print(json.dumps(signatures(args.tree)))


if __name__ == "__main__":
    main()
