"""Runs code in a fresh Python process that cannot import chosen modules.

The one helper for "serve a SavedModel (or load a `.keras` file) where the
package is not importable": the exported artifact must stand on its own, so
the process that loads it must fail loudly if anything tries to import
`keras_attention` (or the `examples` programs, or Keras itself when the
caller says so).

A module is blocked by setting `sys.modules[name] = None` before the
caller's code runs: `import name` (and `import name.sub`) then raises
`ImportError`, even though the package is installed in the environment (it
is an editable install here). The process also runs outside the repository
(`cwd` defaults to `/`) with an empty `PYTHONPATH`, so nothing leaks in
through the working directory.

The caller's code reports back with `answer(value)` (defined in the
prelude): it prints one line `ANSWERS<json>` that `answer_in_fresh_process`
parses. Larger arrays go through files (`np.savez`) named in `args`, which
the code reads from `sys.argv[1:]`.

Example:

    answers = answer_in_fresh_process(
        "import tensorflow as tf\\n"
        "m = tf.saved_model.load(sys.argv[1])\\n"
        "answer([float(v) for v in m.serve(tf.ones((1, 4))).numpy()[0]])\\n",
        args=[export_path],
    )
"""

import atexit
import json
import os
import queue
import subprocess
import sys
import tempfile
import textwrap
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What a served artifact must never need.
BLOCKED_MODULES = ("keras_attention", "examples")

# Keras and everything that would pull it in: for artifacts served with
# TensorFlow alone.
KERAS_MODULES = ("keras", "keras_hub", "tf_keras")

ANSWER_PREFIX = "ANSWERS"

_PRELUDE = textwrap.dedent(
    """\
    import json as _json
    import os as _os
    import sys

    _os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    for _name in {blocked!r}:
        sys.modules[_name] = None


    def answer(value):
        print({prefix!r} + _json.dumps(value), flush=True)


    """
)

# TensorFlow Text's kernels, registered from their shared libraries without
# `import tensorflow_text` (which imports keras through `tf.keras`).
_TENSORFLOW_TEXT_OPS = textwrap.dedent(
    """\
    import glob as _glob
    import importlib.util as _util

    import tensorflow as _tf

    _ops = _os.path.join(
        _os.path.dirname(_util.find_spec("tensorflow_text").origin),
        "python",
        "ops",
    )
    for _lib in sorted(_glob.glob(_os.path.join(_ops, "*.so"))):
        _tf.load_op_library(_lib)


    """
)


def fresh_process_code(code, blocked_modules, tensorflow_text_ops=False):
    """The full program run by `run_in_fresh_process`: prelude + `code`."""
    prelude = _PRELUDE.format(
        blocked=tuple(blocked_modules), prefix=ANSWER_PREFIX
    )
    if tensorflow_text_ops:
        prelude += _TENSORFLOW_TEXT_OPS
    return prelude + textwrap.dedent(code)


def _child_env(pythonpath=(), env=None):
    """The environment of a fresh (or shared) process: TensorFlow quiet,
    no GPU, `PYTHONPATH` of `pythonpath` only, then `env` over it."""
    full_env = dict(
        os.environ,
        TF_CPP_MIN_LOG_LEVEL="3",
        CUDA_VISIBLE_DEVICES="",
        PYTHONPATH=os.pathsep.join(pythonpath),
    )
    full_env.update(env or {})
    return full_env


def run_in_fresh_process(
    code,
    args=(),
    blocked_modules=BLOCKED_MODULES,
    tensorflow_text_ops=False,
    cwd="/",
    env=None,
    pythonpath=(),
    timeout=300,
    check=True,
):
    """Runs `python -c code args...` in a fresh process.

    Args:
        code: Python source; may call `answer(value)` to report a JSON value.
            Dedented before it runs.
        args: strings passed as `sys.argv[1:]`.
        blocked_modules: names that `import` refuses in the process
            (default: `keras_attention` and `examples`; add
            `KERAS_MODULES` for an artifact served by TensorFlow alone).
        tensorflow_text_ops: registers TensorFlow Text's kernels (needed to
            load a SavedModel that tokenizes) without importing
            `tensorflow_text`.
        cwd: working directory (default `/`, outside the repository).
        env: extra environment variables, over the inherited ones. The
            process gets `TF_CPP_MIN_LOG_LEVEL=3`, `CUDA_VISIBLE_DEVICES=""`
            and a `PYTHONPATH` of `pythonpath` only unless `env` says
            otherwise.
        pythonpath: directories put on `PYTHONPATH` (e.g. `ROOT` or the
            tests folder, for code that imports test helpers).
        timeout: seconds before the process is killed.
        check: assert that the process exited with status 0 (the assertion
            message shows the end of its stderr).

    Returns:
        The `subprocess.CompletedProcess` (text `stdout`/`stderr`).
    """
    full_env = _child_env(pythonpath, env)
    program = fresh_process_code(code, blocked_modules, tensorflow_text_ops)
    proc = subprocess.run(
        [sys.executable, "-c", program, *map(str, args)],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=timeout,
    )
    if check:
        assert proc.returncode == 0, (
            f"fresh process exited with {proc.returncode}:\n"
            + proc.stderr[-3000:]
        )
    return proc


def read_answer(proc):
    """The JSON value the process reported with `answer(value)`."""
    lines = [
        line
        for line in proc.stdout.splitlines()
        if line.startswith(ANSWER_PREFIX)
    ]
    assert lines, "no answer from the fresh process:\n" + proc.stderr[-3000:]
    return json.loads(lines[-1][len(ANSWER_PREFIX) :])


def answer_in_fresh_process(code, **kwargs):
    """`run_in_fresh_process(code, **kwargs)`, then its `answer(...)`."""
    return read_answer(run_in_fresh_process(code, **kwargs))


# One long-lived process per set of blocked modules (per pytest worker):
# for the harness's SavedModel checks, which would otherwise start (and
# import TensorFlow in) a fresh process per layer configuration. It is as
# isolated from the test process as a fresh one (the same prelude: the
# blocked modules cannot be imported, `PYTHONPATH` is empty, the working
# directory is the caller's temporary one); only the artifacts it served
# before share it, and each SavedModel stands alone.
_SERVER_LOOP = textwrap.dedent(
    """\
    import traceback as _traceback

    _stdin = sys.stdin
    for _line in _stdin:
        _request = _json.loads(_line)
        sys.argv = ["-c", *_request["args"]]
        _os.chdir(_request["cwd"])
        try:
            exec(
                compile(_request["code"], "<served code>", "exec"),
                {"__name__": "__main__", "sys": sys, "answer": answer},
            )
            _status = {"ok": True}
        except BaseException:
            _status = {"ok": False, "error": _traceback.format_exc()}
        print(_DONE + _json.dumps(_status), flush=True)
    """
)
_DONE_PREFIX = "SERVED"
_SERVERS = {}


class _SharedProcess:
    def __init__(self, blocked_modules):
        program = fresh_process_code("", blocked_modules) + (
            f"_DONE = {_DONE_PREFIX!r}\n" + _SERVER_LOOP
        )
        self._stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-c", program],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=_child_env(),
            cwd="/",
        )
        self._lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)  # the process ended

    def run(self, code, args, cwd, timeout):
        request = {"code": textwrap.dedent(code), "args": list(args)}
        request["cwd"] = str(cwd)
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        output = []
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                self.close()
                raise AssertionError(f"shared process: no reply in {timeout} s")
            if line is None:
                code = self.proc.wait()
                raise AssertionError(
                    f"shared process exited with {code}:\n" + self._tail()
                )
            if line.startswith(_DONE_PREFIX):
                status = json.loads(line[len(_DONE_PREFIX) :])
                assert status["ok"], "served code failed:\n" + status["error"]
                return "".join(output)
            output.append(line)

    def _tail(self):
        self._stderr.seek(0)
        return self._stderr.read()[-3000:]

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()


def run_in_shared_process(
    code, args=(), blocked_modules=BLOCKED_MODULES, cwd="/", timeout=300
):
    """Runs `code` (with `sys.argv[1:] = args`, in directory `cwd`) in a
    process this test process keeps for every call with the same
    `blocked_modules`: the isolation of `run_in_fresh_process` (same
    prelude, empty `PYTHONPATH`) without a Python and TensorFlow start per
    call. Each call runs in a fresh namespace. Returns what the code
    printed (its `answer(...)` lines included, for `read_answer`-style
    parsing); a failing call raises `AssertionError` with its traceback.
    """
    key = tuple(blocked_modules)
    server = _SERVERS.get(key)
    if server is None or server.proc.poll() is not None:
        server = _SERVERS[key] = _SharedProcess(key)
    return server.run(code, args, cwd, timeout)


@atexit.register
def _close_shared_processes():
    for server in _SERVERS.values():
        server.close()
