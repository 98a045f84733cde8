"""Run a Python script in a process forked from one that has already imported torch and transformers.

The tests start ~50 Python processes (example scripts, each rank of a distributed test), and each
spent ~4.5 s of its CPU importing torch, transformers and their kin before its first line of work:
on CI's 2 cores that was a third of ``make test``. Here one server process imports them once
(multiprocessing's forkserver with a preload list) and forks each script's process from it, which
then runs the script as ``python script.py args`` would (``runpy``, ``__name__ == "__main__"``),
with its own environment, working directory and output file, and exits with the script's exit code.

What a fresh interpreter would read from the environment at import time is fixed when the server
starts (``AT_IMPORT``: one OpenMP thread, no hub access, no tokenizer threads), so every script run
here must want those; a script that needs another value there needs ``subprocess``. Importing
torch starts no threads, so forking after it is safe (multiprocessing's own forkserver preload).

>>> import sys, tempfile
>>> log = Path(tempfile.mkdtemp()) / "out.log"
>>> proc = start(["-c", "import sys, torch; print('hello', sys.argv[1:]); sys.exit(3)", "x"], log=log)
>>> proc.wait(60), log.read_text()
(3, "hello ['x']\\n")
>>> run(["-c", "import sys; print('out'); print('err', file=sys.stderr)"])
(0, 'out\\n', 'err\\n')
>>> _ = start(["-c", "import sys; print('one'); print('two', file=sys.stderr); print('three')"], log=log).wait(60)
>>> log.read_text()  # both streams in one log, in order, none overwriting the other
'one\\ntwo\\nthree\\n'
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import subprocess
import sys
import traceback
from pathlib import Path

__all__ = ["AT_IMPORT", "start", "run", "subprocess_run", "drive"]

AT_IMPORT = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
             "HF_DATASETS_OFFLINE": "1"}  # fmt: skip
# TRL's trainers too: the benchmark harnesses' settings import them (~5 s of CPU each on CI); a missing one is skipped
PRELOAD = ["torch", "torch.distributed", "transformers", "transformers.trainer", "datasets", "numpy",
           "trl.trainer.sft_trainer", "trl.trainer.dpo_trainer", "trl.trainer.grpo_trainer"]  # fmt: skip
ROOT = Path(__file__).resolve().parents[1]

_context = None
_REAL_RUN = subprocess.run  # what subprocess_run falls back on, also while it stands in for subprocess.run


def _server():
    """The forkserver context, its server started (once) under ``AT_IMPORT``."""
    global _context
    if _context is None:
        from multiprocessing import forkserver

        saved = {name: os.environ.get(name) for name in AT_IMPORT}
        os.environ.update(AT_IMPORT)
        try:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOAD)
            forkserver.ensure_running()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        _context = context
    return _context


def _main(argv: list[str], env: dict, cwd: str, log: str, err: str | None) -> None:
    """The forked process: ``python *argv`` in ``cwd`` with ``env``, its output to ``log`` (its stderr to ``err``
    if given); exits with the script's code."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    output = os.open(log, flags, 0o644)
    os.dup2(output, 1)
    os.dup2(output if err is None else os.open(err, flags, 0o644), 2)  # one log: one descriptor, one offset
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (the process's own stdout)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path.insert(0, str(ROOT))  # this checkout's package, whatever copy is installed
    code = 0
    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path.insert(0, "")
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = list(argv)
            sys.path.insert(0, str(Path(argv[0]).resolve().parent))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as error:
        if isinstance(error.code, int) or error.code is None:
            code = error.code or 0
        else:
            print(error.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 (reported as the interpreter would, then exit 1)
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Started:
    """A started script, as much of ``subprocess.Popen`` as the tests use: poll, wait, kill, returncode."""

    def __init__(self, process):
        self._process = process

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int | None:
        self._process.join(timeout)
        return self._process.exitcode

    def kill(self) -> None:
        self._process.kill()


def start(argv: list[str], *, log: Path, err: Path | None = None, env: dict | None = None, cwd: Path = ROOT) -> Started:
    """Start ``python *argv`` (a script path and its arguments, or ``-c CODE``); output to ``log`` (stderr too,
    unless ``err`` names a file for it).

    ``env`` (default: this process's) gets this checkout at the head of ``PYTHONPATH`` and ``AT_IMPORT``,
    as the server imported under them."""
    env = {**(os.environ if env is None else env), **AT_IMPORT}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    paths = (str(log), None if err is None else str(err))
    process = _server().Process(target=_main, args=(list(argv), env, str(cwd), *paths), daemon=False)
    process.start()
    return Started(process)


def run(argv: list[str], *, env: dict | None = None, cwd: Path = ROOT, timeout: float = 300) -> tuple[int, str, str]:
    """``start`` and wait: (exit code, stdout, stderr), as ``subprocess.run`` would give them. A process past
    ``timeout`` is killed (exit -9)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        proc = start(argv, log=out, err=err, env=env, cwd=cwd)
        if proc.wait(timeout) is None:
            proc.kill()
            proc.wait()
        return proc.returncode, out.read_text(errors="replace"), err.read_text(errors="replace")


def subprocess_run(command, *, stdout=None, stderr=None, env=None, cwd=None, timeout=None, **options):
    """``subprocess.run`` for a benchmark driver that runs each setting as ``[sys.executable, script, *args]`` with
    its output to a file (``stdout=sink, stderr=subprocess.STDOUT``): that command forked from the server instead
    (its own process, as before, without its seconds of imports); any other command runs as it would.

    >>> import subprocess, tempfile
    >>> log = Path(tempfile.mkdtemp()) / "log"
    >>> with log.open("w") as sink:
    ...     done = subprocess_run([sys.executable, "-c", "print('hi'); raise SystemExit(2)"], stdout=sink,
    ...                           stderr=subprocess.STDOUT)
    >>> done.returncode, log.read_text()
    (2, 'hi\\n')
    >>> with log.open("w") as sink:
    ...     subprocess_run([sys.executable, "-c", "import time; time.sleep(30)"], stdout=sink,
    ...                    timeout=1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    subprocess.TimeoutExpired: Command '...' timed out after 1 seconds
    """
    forked = command[0] == sys.executable and hasattr(stdout, "name") and stderr in (subprocess.STDOUT, None)
    if not forked or options or cwd is not None:
        return _REAL_RUN(command, stdout=stdout, stderr=stderr, env=env, cwd=cwd, timeout=timeout, **options)
    stdout.flush()
    proc = start(list(command[1:]), log=Path(stdout.name), env=env)
    if proc.wait(timeout) is None:
        proc.kill()
        proc.wait()
        raise subprocess.TimeoutExpired(command, timeout)
    return subprocess.CompletedProcess(command, proc.returncode)


def drive(main, argv: list[str]) -> str:
    """A benchmark driver's ``main(argv)`` (``--all``: each setting its own process) run in this process, each
    setting's process forked from the server (:func:`subprocess_run`); what the driver printed."""
    import contextlib
    import io

    printed = io.StringIO()
    saved = subprocess.run
    subprocess.run = subprocess_run
    try:
        with contextlib.redirect_stdout(printed):
            main(argv)
    finally:
        subprocess.run = saved
    return printed.getvalue()
