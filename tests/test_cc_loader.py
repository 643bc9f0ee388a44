"""TF Serving's own load path (tensorflow::LoadSavedModel, XLA off) in C++."""

import numpy as np
import pytest
from conftest import histories

from static_keras.export import export_saved_model
from static_keras.serving.cc_loader import CcLoaderError
from static_keras.serving.cc_loader import build_runner
from static_keras.serving.cc_loader import compiler
from static_keras.serving.cc_loader import run_saved_model

pytestmark = pytest.mark.skipif(compiler() is None, reason="needs a C++ compiler (g++)")


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    return build_runner(str(tmp_path_factory.mktemp("cc")))


def test_cc_loader_matches_python(small_model, runner, tmp_path):
    index, model = small_model
    export_saved_model(model, tmp_path / "model")
    for batch in (histories(1, seed=5), histories(3, seed=6)):
        result = run_saved_model(tmp_path / "model", {"history": batch}, binary=runner)
        expected = model.predict(batch, verbose=0)
        assert set(result.outputs) == {"tokens", "scores", "item_ids"}
        for name, value in expected.items():
            assert result.outputs[name].dtype == value.dtype
            np.testing.assert_array_equal(result.outputs[name], value)
        assert index.contains(result.outputs["tokens"].reshape(-1, index.length)).all()
        assert result.load_ms > 0


def test_xla_export_fails_with_xla_disabled_and_runs_with_it(small_model, runner, tmp_path):
    _, model = small_model
    export_saved_model(model, tmp_path / "xla", xla=True)
    batch = histories(2, seed=7)
    with pytest.raises(CcLoaderError, match="XLA compilation disabled"):
        run_saved_model(tmp_path / "xla", {"history": batch}, binary=runner, xla=False)
    result = run_saved_model(tmp_path / "xla", {"history": batch}, binary=runner, xla=True)
    expected = model.predict(batch, verbose=0)
    np.testing.assert_array_equal(result.outputs["tokens"], expected["tokens"])
    np.testing.assert_allclose(result.outputs["scores"], expected["scores"], rtol=1e-5)


def test_cc_loader_reports_bad_input(small_model, runner, tmp_path):
    _, model = small_model
    export_saved_model(model, tmp_path / "model")
    with pytest.raises(CcLoaderError, match="not in signature"):
        run_saved_model(tmp_path / "model", {"wrong": histories(1)}, binary=runner)


@pytest.mark.slow  # the C++ runner and a dev server side by side: 16 s
def test_cc_loader_and_dev_server_agree_on_ids_shapes_and_dtypes(small_model, runner, tmp_path):
    """The signature validates ids and shapes in both load paths; both refuse the same dtypes."""
    from conftest import CONTEXT_VOCAB

    from static_keras.export import publish
    from static_keras.serving import GrpcClient
    from static_keras.serving import ServedModel
    from static_keras.serving import ServingError
    from static_keras.serving.dev_server import DevServer

    _, model = small_model
    info = publish(model, tmp_path / "recs", warmup_batch_sizes=(1,))
    outside = f"outside \\[0, {CONTEXT_VOCAB}\\)"
    with DevServer([ServedModel("recs", str(tmp_path / "recs"))]) as server:
        with GrpcClient(server.grpc_address) as client:
            for bad in (10**6, -1, CONTEXT_VOCAB):
                value = np.full((1, 5), bad, "int32")
                with pytest.raises(CcLoaderError, match=outside) as error:
                    run_saved_model(info.path, {"history": value}, binary=runner)
                assert error.value.code == "INVALID_ARGUMENT"
                with pytest.raises(ServingError, match=outside) as served:
                    client.predict("recs", {"history": value})
                assert served.value.code == "INVALID_ARGUMENT"
            # Another length than the signature's [None, 5]: Session::Run feeds it
            # as it is, and the signature's own check refuses it in both.
            shape = r"history.{1,3} must have shape \[batch, 5\] .*received shape\W+1\W+3\W"
            short = histories(1, seed=8)[:, :3]
            with pytest.raises(CcLoaderError, match=shape) as error:
                run_saved_model(info.path, {"history": short}, binary=runner)
            assert error.value.code == "INVALID_ARGUMENT"
            with pytest.raises(ServingError, match=shape) as served:
                client.predict("recs", {"history": short})
            assert served.value.code == "INVALID_ARGUMENT"
            # Another integer dtype: Session::Run refuses it in both.
            wide = histories(1).astype("int64")
            with pytest.raises(CcLoaderError, match="int32.*int64|int64.*int32") as error:
                run_saved_model(info.path, {"history": wide}, binary=runner)
            assert error.value.code == "INVALID_ARGUMENT"
            with pytest.raises(ServingError, match="int32 but int64"):
                client.predict("recs", {"history": wide})
