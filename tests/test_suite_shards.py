"""tests/conftest.py's JGA_TEST_SHARD=I/N, which benchmarks/gpu_run.sh uses to run the GPU suite as N
processes at once: the shards together hold every test exactly once, and a bad value is refused."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

_ERRORS_FILE = Path(__file__).parent / "test_errors.py"  # many parametrized tests, quick to collect


def _collect(tmp_path, shard):
    env = dict(os.environ)
    env.pop("JGA_TEST_SHARD", None)
    if shard is not None:
        env["JGA_TEST_SHARD"] = shard
    # From tmp_path, so that the installed package is imported, not the source tree.
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", str(_ERRORS_FILE)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    return out.returncode, [line for line in out.stdout.splitlines() if "::" in line], out.stdout + out.stderr


def test_shards_partition_the_suite(tmp_path):
    rc, everything, log = _collect(tmp_path, None)
    assert rc == 0 and len(everything) > 10, log
    shards = []
    for i in range(3):
        rc, ids, log = _collect(tmp_path, f"{i}/3")
        assert rc == 0 and ids, log
        shards.append(ids)
    together = [t for ids in shards for t in ids]
    assert sorted(together) == sorted(everything)  # each test once: no loss, no repeat
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


@pytest.mark.parametrize("bad", ["3/3", "1", "a/b", "-1/2"])
def test_bad_shard_is_refused(monkeypatch, bad):
    import conftest

    monkeypatch.setenv("JGA_TEST_SHARD", bad)
    with pytest.raises(pytest.UsageError, match="JGA_TEST_SHARD must be I/N"):
        conftest.pytest_collection_modifyitems(config=None, items=[])
