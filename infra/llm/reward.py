"""User rewards named ``module:function`` or ``path/to/file.py:function``, run in a worker process under a time limit.

A reward is any ``fn(prompt: str, completion: str, answer: str) -> float`` of an importable module (on
``PYTHONPATH`` or in the working directory, which ``python -m`` puts first on the worker's path) or of a
Python file (a relative path is read from the working directory). Neither the
job's driver nor the reward service imports it: a reward that hangs cannot be stopped inside
Python, and one that crashes the interpreter would take the process down. :class:`RewardRunner`
keeps one worker process per reward (``python -m infra.llm.reward module:function``):

- the worker imports and checks the reward first and says it is ready; the runner waits for that
  at most ``import_timeout_s`` (apart from the per-call limit, so a slow import never makes every
  call time out), and an import that fails or hangs raises :class:`RewardUnavailable` in one line;
- requests and replies travel on a pipe pair of their own (passed as file descriptors), never on
  the worker's stdin/stdout: the reward's prints go to stderr and its reads of stdin see an empty
  file, so nothing the reward does with the standard streams reaches the protocol;
- a call that raises, returns something other than a finite number, kills the worker, or does not
  answer within ``timeout_s`` (the worker is then killed and started again) scores 0 and is
  counted, so a bad call costs its completion, never the job.

:func:`resolve_reward` is the in-worker check: the spec parses, the module imports, the function
exists and accepts ``(prompt, completion, answer)``. :func:`check_reward` runs it in a worker, under
the import limit, before a job starts.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import json
import math
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, Any

from infra.common.supervisor import Supervisor

RewardFn = Callable[[str, str, str], float]


def parse_spec(spec: str) -> tuple[str, str]:
    """``(module or file, function)`` of ``spec``; ``ValueError`` with the fix when it is not ``module:function``
    or ``path/to/file.py:function``."""
    module_name, sep, fn_name = spec.rpartition(":")  # a function's name holds no colon; a file's path may
    if not sep or not module_name or not fn_name:
        raise ValueError(f"reward={spec!r} is not 'module:function' or 'path/to/file.py:function' "
                         "(e.g. reward=my_rewards:gsm8k).")
    return module_name, fn_name


def _load_file(path: Path) -> ModuleType:
    """The module of the Python file ``path``, executed under a name of its own (``reward_file_<stem>``, so that
    a file called ``json.py`` shadows nothing) and registered in ``sys.modules`` as an import would be."""
    name = f"reward_file_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def resolve_reward(spec: str) -> RewardFn:
    """The function ``spec`` (``module:function`` or ``path/to/file.py:function``) names; ``ValueError`` with the
    fix when it cannot be used."""
    module_name, fn_name = parse_spec(spec)
    is_file = module_name.endswith(".py")
    if is_file and not Path(module_name).is_file():
        raise ValueError(f"reward={spec!r}: there is no file {module_name} (from the working directory "
                         f"{os.getcwd()}); give the path of the reward's file, or its module (reward=module:function).")
    try:
        module = _load_file(Path(module_name)) if is_file else importlib.import_module(module_name)
    except Exception as e:  # any import-time failure of user code is the same user error
        fix = ("fix the file" if is_file else
               f"put it on PYTHONPATH or in the working directory, or give its file (reward=path/to/file.py:{fn_name})")
        raise ValueError(f"reward={spec!r}: {'file' if is_file else 'module'} {module_name!r} cannot be imported "
                         f"({type(e).__name__}: {e}); {fix}.") from e
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ValueError(f"reward={spec!r}: {module_name} has no function {fn_name!r}.")
    try:
        inspect.signature(fn).bind("prompt", "completion", "answer")
    except TypeError as e:
        raise ValueError(f"reward={spec!r}: {fn_name}{inspect.signature(fn)} cannot be called as "
                         f"{fn_name}(prompt, completion, answer) ({e}).") from e
    except ValueError:  # builtins without a signature: accepted, checked by the first call
        pass
    return fn


@dataclass
class RewardBatch:
    """Scores of one batch, and how many completions scored 0 because the reward failed."""

    scores: list[float]
    errors: int = 0
    """Calls that raised, returned a non-number, or killed the worker."""
    timeouts: int = 0
    """Calls that did not return within the time limit."""
    first_error: str = ""
    """The first failure's message (empty when none)."""


class RewardUnavailable(RuntimeError):
    """The reward's worker cannot serve: its module fails to import or to check, or its import outlives
    the import limit. The job cannot score anything, so it stops."""


class RewardRunner:
    """One worker process running the reward ``spec``; ``score`` scores a batch under ``timeout_s`` per call,
    after the worker's import of the reward, which may take up to ``import_timeout_s``."""

    def __init__(self, spec: str, timeout_s: float, import_timeout_s: float = 60.0) -> None:
        for name, value in (("reward_timeout_s", timeout_s), ("reward_import_timeout_s", import_timeout_s)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value} must be a finite number of seconds > 0.")
        self.spec = spec
        self.timeout_s = timeout_s
        self.import_timeout_s = import_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._requests: IO[str] | None = None
        self._replies: IO[str] | None = None
        # No budget: a failed call scores 0 and the next call starts a new worker; the job's
        # reward_max_failed_share bounds how many calls of a batch may fail.
        self.supervisor = Supervisor(f"the reward worker of {spec}", None, "reward_max_failed_share")
        self.import_s = 0.0
        """Seconds the last worker took to import and check the reward (from its start to ready)."""

    def _start(self) -> None:
        """Start a worker and wait until it has imported the reward.

        Raises:
            RewardUnavailable: the import fails, the worker dies, or it is not ready within ``import_timeout_s``.
        """
        # The worker resolves the module exactly as this process does: same sys.path, same directory.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        try:
            # stdout=2: the reward's prints land on this process's stderr; stdin is empty.
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "infra.llm.reward", self.spec, str(req_r), str(rep_w)],
                stdin=subprocess.DEVNULL, stdout=2, env=env, cwd=os.getcwd(), pass_fds=(req_r, rep_w))
        finally:
            os.close(req_r)
            os.close(rep_w)
        self._requests = os.fdopen(req_w, "w")
        self._replies = os.fdopen(rep_r, "r")
        began = time.monotonic()
        line = self._read(self.import_timeout_s)
        self.import_s = time.monotonic() - began
        if line is None or not line:
            self._kill()
            what = (f"did not finish importing within reward_import_timeout_s={self.import_timeout_s} s" if line is None
                    else "exited while importing")
            raise RewardUnavailable(f"reward {self.spec}: the worker {what}; fix the module's import (run "
                                    f"python -c 'import {self.spec.partition(':')[0]}'), or raise reward_import_timeout_s.")
        reply = _decode(line)
        if reply is None or reply.get("ready") is not True:
            self._kill()
            raise RewardUnavailable(str((reply or {}).get("error", f"reward {self.spec}: the worker sent "
                                                                    f"{line.strip()[:80]!r}, not a reply")))

    def _read(self, timeout_s: float) -> str | None:
        """The worker's next reply line: None after ``timeout_s``, ``""`` when the worker closed its end."""
        assert self._replies is not None
        ready, _, _ = select.select([self._replies], [], [], timeout_s)
        return self._replies.readline() if ready else None

    def _kill(self) -> None:
        for stream in (self._requests, self._replies):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._requests = self._replies = None
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    @property
    def restarts(self) -> int:
        """Workers stopped after a timeout, a death or a broken reply (each call after one starts a new one)."""
        return self.supervisor.restarts

    def close(self) -> None:
        """Stop the worker."""
        self._kill()

    def _call(self, prompt: str, completion: str, answer: str) -> tuple[float | None, str, bool]:
        """(score, error message, timed out) of one call; restarts the worker after a timeout or a death."""
        if self._proc is None or self._proc.poll() is not None:
            self._kill()
            self._start()
        assert self._requests is not None
        try:
            self._requests.write(json.dumps([prompt, completion, answer]) + "\n")
            self._requests.flush()
            line = self._read(self.timeout_s)
        except (BrokenPipeError, OSError):
            line = ""
        if line is None:
            message = f"reward {self.spec} did not return within {self.timeout_s} s"
            self.supervisor.restart(message, self._kill)
            return None, message, True
        reply = _decode(line) if line else None
        if reply is None:  # a worker that died or broke the protocol is started again for the next call
            broke = f"sent {line.strip()[:80]!r}, not a reply" if line else "process died"
            message = f"reward {self.spec}: the worker {broke}"
            self.supervisor.restart(message, self._kill)
            return None, message, False
        if "score" in reply:
            return reply["score"], "", False
        return None, str(reply.get("error")), False

    def score(self, prompts: list[str], completions: list[str], answers: list[str]) -> RewardBatch:
        """Scores of each (prompt, completion, answer); a failed call scores 0 and is counted.

        Raises:
            RewardUnavailable: the worker cannot import the reward (see :meth:`_start`).
        """
        if not (len(prompts) == len(completions) == len(answers)):
            raise ValueError(f"{len(prompts)} prompts, {len(completions)} completions and {len(answers)} answers; "
                             "pass one of each per sample.")
        batch = RewardBatch(scores=[])
        for p, c, a in zip(prompts, completions, answers):
            value, message, timed_out = self._call(p, c, a)
            batch.scores.append(0.0 if value is None else value)
            if value is None:
                batch.timeouts += timed_out
                batch.errors += not timed_out
                batch.first_error = batch.first_error or message
        return batch


def check_reward(spec: str, import_timeout_s: float) -> None:
    """Import and check ``spec`` in a worker process (never in this one) under ``import_timeout_s``.

    Raises:
        ValueError: the spec is not ``module:function``, or the worker cannot import or use it (the
            worker's one-line message), or the import outlives ``import_timeout_s``.
    """
    parse_spec(spec)
    runner = RewardRunner(spec, timeout_s=1.0, import_timeout_s=import_timeout_s)
    try:
        runner._start()
    except RewardUnavailable as e:
        raise ValueError(str(e)) from None
    finally:
        runner.close()


def _decode(line: str) -> dict[str, Any] | None:
    """A reply line of the worker as a dict; None when it is not a JSON object (the protocol broke)."""
    try:
        reply = json.loads(line)
    except ValueError:
        return None
    return reply if isinstance(reply, dict) else None


def _serve(spec: str, requests: IO[str], replies: IO[str]) -> None:
    """The worker's loop: import the reward and say so, then one JSON ``[prompt, completion, answer]`` per
    line in on ``requests``, one reply per line out on ``replies``."""
    sys.stdout = sys.stderr  # belt and braces: stdout is already the job's stderr (Popen stdout=2)

    def reply(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    try:
        fn = resolve_reward(spec)
    except ValueError as e:
        reply({"error": str(e)})
        return
    reply({"ready": True})
    for line in requests:
        prompt, completion, answer = json.loads(line)
        try:
            value = fn(prompt, completion, answer)
            if not isinstance(value, int | float) or not math.isfinite(value):  # bools count as 0/1
                raise TypeError(f"returned {value!r}, not a finite float")
            reply({"score": float(value)})
        except Exception as e:  # the user's reward failing is the event this worker exists to contain
            reply({"error": f"reward {spec} raised {type(e).__name__}: {e}"})


if __name__ == "__main__":
    _serve(sys.argv[1], os.fdopen(int(sys.argv[2]), "r"), os.fdopen(int(sys.argv[3]), "w"))
