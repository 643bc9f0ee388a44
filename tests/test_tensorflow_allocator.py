"""TensorFlow's CPU memory goes back to the system when a version is unloaded.

The wheel's oneDNN allocator keeps every freed buffer (a server kept the old
version's index after each swap: 2.06-2.16x one version's RSS at 2x10^7);
`static-keras` commands select the system allocator before TensorFlow runs.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from static_keras.cli import main
from static_keras.tensorflow_allocator import SYSTEM_ALLOCATOR
from static_keras.tensorflow_allocator import return_freed_memory

# A fresh process: creates a 256 MiB variable, frees it, and prints the RSS
# given back (MiB). TensorFlow must not have run an op before the setting.
_FREED = """
from static_keras.tensorflow_allocator import return_freed_memory
return_freed_memory()
import tensorflow as tf
from static_keras.serving.servable import release_memory

def rss():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) for l in status if l.startswith("VmRSS")) // 1024

variable = tf.Variable(tf.ones([64 * 2**20], tf.int32))
held = rss()
del variable
release_memory()
print(held - rss())
"""


def _freed_mib() -> int:
    env = {k: v for k, v in os.environ.items() if k != SYSTEM_ALLOCATOR}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    done = subprocess.run([sys.executable, "-c", _FREED], env=env, capture_output=True,
                          text=True, timeout=300, check=True)  # fmt: skip
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_freed_tensor_goes_back_to_the_system():
    # TensorFlow 2.21's own default keeps the 256 MiB (what made servers
    # grow); the kit's setting gives it back.
    assert _freed_mib() > 200


def test_the_setting_yields_to_the_users(monkeypatch):
    monkeypatch.delenv(SYSTEM_ALLOCATOR, raising=False)
    return_freed_memory()
    assert os.environ[SYSTEM_ALLOCATOR] == "1"
    monkeypatch.setenv(SYSTEM_ALLOCATOR, "0")
    return_freed_memory()
    assert os.environ[SYSTEM_ALLOCATOR] == "0"


def test_every_command_sets_it_first(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv(SYSTEM_ALLOCATOR, raising=False)
    np.save(tmp_path / "ids.npy", np.arange(12).reshape(4, 3) % 8)
    assert main(["build-index", str(tmp_path / "ids.npy"), "--vocab-size", "8",
                 "--out", str(tmp_path / "index.npz")]) == 0  # fmt: skip
    assert os.environ[SYSTEM_ALLOCATOR] == "1"
