"""Fixtures the simulator tests share."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="session")
def libero_python() -> Path:
    """LIBERO's own interpreter (``.venv-libero``, or ``$LIBERO_VENV``), made by whichever test needs it first when
    it is absent or stale (scripts/setup_libero_venv.py: about 2 GB, 1-3 minutes), as a fresh clone's ``make test``
    does."""
    if str(SCRIPTS) not in sys.path:  # as `python scripts/x.py` has it
        sys.path.insert(0, str(SCRIPTS))
    from setup_libero_venv import ensure_libero_venv

    return ensure_libero_venv()
