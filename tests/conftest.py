import os
import zlib
import sys

import jax
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
jax.config.update("jax_enable_x64", False)
# Eight virtual CPU devices for the sharding tests (set before any backend starts).
jax.config.update("jax_num_cpu_devices", 8)


@pytest.fixture
def rng(request):
    # A fresh, test-specific stream: different data per test, reproducible per test id.
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


def on_gpu() -> bool:
    return jax.default_backend() == "gpu"
