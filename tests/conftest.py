import os
import sys
import zlib

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


def pytest_collection_modifyitems(config, items):
    """JGA_TEST_SHARD=I/N keeps every N-th test from the I-th (0-based) and deselects the rest.
    benchmarks/gpu_run.sh runs the GPU suite as N such processes at once: its time is mostly XLA's
    compiles on the host, and one GPU serves them all (no test here measures time)."""
    shard = os.environ.get("JGA_TEST_SHARD")
    if not shard:
        return
    try:
        index, count = (int(part) for part in shard.split("/"))
        if not 0 <= index < count:
            raise ValueError
    except ValueError:
        raise pytest.UsageError(f"JGA_TEST_SHARD must be I/N with 0 <= I < N, got {shard!r}") from None
    kept, deselected = [], []
    for j, item in enumerate(items):
        (kept if j % count == index else deselected).append(item)
    config.hook.pytest_deselected(items=deselected)
    items[:] = kept


def on_gpu() -> bool:
    return jax.default_backend() == "gpu"
