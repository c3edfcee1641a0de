"""Runs a script in a fresh TensorFlow process and reads how much its peak
RSS grew; the script prints `before after` (MiB) as its last two words."""

import serving


def peak_growth_mib(script, timeout=600):
    done = serving.run_in_fresh_process(
        script,
        blocked_modules=(),
        cwd=None,
        env={"KERAS_BACKEND": "tensorflow"},
        pythonpath=(serving.ROOT,),
        timeout=timeout,
    )
    before, after = map(float, done.stdout.split()[-2:])
    return after - before
