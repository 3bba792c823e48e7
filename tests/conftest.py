"""Test-wide environment: loopback-only Ray, headless rendering, offline hubs and wandb."""

import os
from pathlib import Path

import pytest

# Set before Ray, MuJoCo or any hub client is imported by a test module.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# No Ray call starts a cluster of its own: one after a test's ray.shutdown() (a watcher thread's last call, say)
# would otherwise start a whole local Ray (both cores, a dashboard) that the next teardown kills.
os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
# Ray's core worker ends its whole process (exit status 1, nothing printed) once the GCS it is connected to has
# been unreachable for this long (60 s by default): such a cluster killed under the test process made pytest die
# a minute later in an unrelated test. The tests never wait on a lost GCS.
os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", "3600")
# A script a test runs in a subprocess imports the tree under test, not the checkout the project is installed
# from (scripts find the packages through the installation: they do not edit sys.path).
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                         os.environ.get("PYTHONPATH")]))

_EXIT_STATUS: int | None = None


def pytest_sessionfinish(session, exitstatus):
    global _EXIT_STATUS
    _EXIT_STATUS = int(exitstatus)


def pytest_unconfigure(config):
    """Leave with pytest's own status once every result is reported.

    Interpreter finalisation after a full run intermittently segfaults inside native libraries'
    teardown (1 of 4 clean-clone runs, after all tests had passed and the summary was printed; no
    Python frame in the crash), which turned a green run red. Nothing of the tests' outcome is
    skipped: only the process's own teardown.
    """
    import sys

    if _EXIT_STATUS is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS)


@pytest.fixture
def script(monkeypatch):
    """``script(name)``: the module ``scripts/<name>.py``, loaded by path (its ``main(argv)`` runs it in process),
    with ``scripts/`` on ``sys.path`` as ``python scripts/<name>.py`` has it (its sibling ``bench_report``)."""
    import importlib.util
    from pathlib import Path

    scripts = Path(__file__).resolve().parents[1] / "scripts"
    monkeypatch.syspath_prepend(str(scripts))

    def load(name: str):
        path = scripts / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"{name}_script", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
