"""Helpers the test tiers share (tests/ is on sys.path: `from support.daemon
import wait_for`). Fixtures are registered by each tier's conftest.py."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
C_DIR = TESTS / "c"
DATA = TESTS / "data"
