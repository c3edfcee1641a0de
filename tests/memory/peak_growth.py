"""Runs a script in a fresh TensorFlow process and reads how much its peak
RSS grew; the script prints `before after` (MiB) as its last two words."""

import os
import subprocess
import sys

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def peak_growth_mib(script, timeout=600):
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    before, after = map(float, done.stdout.split()[-2:])
    return after - before
