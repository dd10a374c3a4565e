"""The contract suite runs against the unit tests' fake sandbox: make `fakesandbox` importable
here as it is there (tests/unit is not a package)."""

from __future__ import annotations

import sys
from pathlib import Path

UNIT = str(Path(__file__).resolve().parent.parent / "unit")
if UNIT not in sys.path:
    sys.path.insert(0, UNIT)
