"""What the benchmark scripts share (no script imports another): harness, peers, py-spy."""

import sys
from pathlib import Path

#: tests/ holds the server fixtures the benchmarks start (seaweed.py, azurite.py, ...)
TESTS = Path(__file__).resolve().parent.parent.parent / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
