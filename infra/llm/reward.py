"""User rewards named ``module:function``, run in a worker process under a time limit.

A reward is any importable ``fn(prompt: str, completion: str, answer: str) -> float``. The
reward service never calls it in its own process: a reward that hangs cannot be stopped inside
Python, and one that crashes the interpreter would take the service down. :class:`RewardRunner`
keeps one worker process per reward (``python -m infra.llm.reward module:function``) and sends it
one completion at a time; a call that raises, returns something other than a finite number,
kills the worker, or does not answer within ``timeout_s`` (the worker is then killed and started
again) scores 0 and is counted, so a bad reward costs its completions, never the job.

:func:`resolve_reward` is the check a job runs before anything starts: the spec parses, the module
imports, the function exists and accepts ``(prompt, completion, answer)``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import os
import select
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

RewardFn = Callable[[str, str, str], float]


def resolve_reward(spec: str) -> RewardFn:
    """The function ``spec`` (``module:function``) names; ``ValueError`` with the fix when it cannot be used."""
    module_name, sep, fn_name = spec.partition(":")
    if not sep or not module_name or not fn_name:
        raise ValueError(f"reward={spec!r} is not 'module:function' (e.g. reward=my_rewards:gsm8k).")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # any import-time failure of user code is the same user error
        raise ValueError(f"reward={spec!r}: module {module_name!r} cannot be imported ({type(e).__name__}: {e}); "
                         "put it on PYTHONPATH or in the working directory.") from e
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


class RewardRunner:
    """One worker process running the reward ``spec``; ``score`` scores a batch under ``timeout_s`` per call."""

    def __init__(self, spec: str, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"reward_timeout_s={timeout_s} must be > 0.")
        self.spec = spec
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen[str] | None = None
        self.restarts = 0

    def _start(self) -> subprocess.Popen[str]:
        # The worker resolves the module exactly as this process does: same sys.path, same directory.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        return subprocess.Popen([sys.executable, "-m", "infra.llm.reward", self.spec], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env, cwd=os.getcwd())

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        """Stop the worker."""
        self._kill()

    def _call(self, prompt: str, completion: str, answer: str) -> tuple[float | None, str, bool]:
        """(score, error message, timed out) of one call; restarts the worker after a timeout or a death."""
        if self._proc is None or self._proc.poll() is not None:
            self._proc = self._start()
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps([prompt, completion, answer]) + "\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], self.timeout_s)
            line = proc.stdout.readline() if ready else None
        except (BrokenPipeError, OSError):
            line = ""
        if line is None:
            self._kill()
            self.restarts += 1
            return None, f"reward {self.spec} did not return within {self.timeout_s} s", True
        if not line:
            self._kill()
            self.restarts += 1
            return None, f"reward {self.spec}: the worker process died", False
        reply = json.loads(line)
        return (reply["score"], "", False) if "score" in reply else (None, reply["error"], False)

    def score(self, prompts: list[str], completions: list[str], answers: list[str]) -> RewardBatch:
        """Scores of each (prompt, completion, answer); a failed call scores 0 and is counted."""
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


def _serve(spec: str) -> None:
    """The worker's loop: one JSON ``[prompt, completion, answer]`` per line in, one reply per line out."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the reward's own prints go to stderr, never into the protocol
    sys.stdout = sys.stderr
    fn = resolve_reward(spec)
    for line in sys.stdin:
        prompt, completion, answer = json.loads(line)
        try:
            value = fn(prompt, completion, answer)
            if not isinstance(value, int | float) or not math.isfinite(value):  # bools count as 0/1
                raise TypeError(f"returned {value!r}, not a finite float")
            reply = {"score": float(value)}
        except Exception as e:  # the user's reward failing is the event this worker exists to contain
            reply = {"error": f"reward {spec} raised {type(e).__name__}: {e}"}
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()


if __name__ == "__main__":
    _serve(sys.argv[1])
