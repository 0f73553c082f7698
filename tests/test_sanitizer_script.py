"""tests/sanitizer_cases.py (what `gpu_run.sh memcheck` runs under compute-sanitizer) runs whole on
the default backend: a case that the library refuses, or that goes wrong, would leave memcheck
checking nothing past it."""

import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "sanitizer_cases.py")


def test_every_sanitizer_case_runs_and_checks_out():
    env = {k: v for k, v in os.environ.items() if k != "JGA_SANITIZER_CASES"}  # every case, whatever the caller picked
    done = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [line for line in done.stdout.splitlines() if ": ok on " in line]
    assert len(lines) >= 16, done.stdout
