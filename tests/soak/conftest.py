"""Options of the soak tier: --seed N replays one schedule, --ops N sets its length."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from collections.abc import Iterator

import pytest
from ci_seeds import CI_JOBS, CI_OPS, CI_SEEDS, FAMILY_SEEDS, REGRESSION_SEEDS, Case


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("soak")
    group.addoption("--seed", type=int, default=None,
                    help="tests/soak: replay the schedule of this one seed")
    group.addoption("--ops", type=int, default=None,
                    help="tests/soak: operations per schedule (with --seed)")
    group.addoption("--family", default="mixed",
                    help="tests/soak: the schedule family of --seed (soaklib.FAMILIES)")
    group.addoption("--shrink", action="store_true", default=False,
                    help="tests/soak: shrink a failing --seed to a short schedule")


def batches(name: str, cases: list[Case], size: int) -> list[tuple[str, list[Case]]]:
    """`cases` in groups of `size` (similar lengths together), each with its test id."""
    cases = sorted(cases, key=lambda c: c[2], reverse=True)
    out = []
    for i in range(0, len(cases), size):
        group = cases[i:i + size]
        family = group[0][0]
        ids = ",".join(f"{s}x{n}" for _, s, n in group)
        out.append((f"{name}-{family}-seeds{ids}", group))
    return out


def soak_batches(config: pytest.Config) -> list[tuple[str, list[Case]]]:
    """What CI runs (the fixed set, the regression seeds, the other families), or the
    one schedule of --seed."""
    seed = config.getoption("--seed", default=None)
    if seed is not None:
        ops = config.getoption("--ops", default=None) or CI_OPS
        family = config.getoption("--family", default="mixed")
        return [(f"replay-{family}-seed{seed}x{ops}", [(family, seed, ops)])]
    fixed: list[Case] = [("mixed", s, CI_OPS) for s in CI_SEEDS]
    regression = [("mixed", s, n) for s, n, _ in REGRESSION_SEEDS
                  if ("mixed", s, n) not in fixed]
    return (batches("ci", fixed, CI_JOBS) + batches("regression", regression, CI_JOBS)
            + batches("family", list(FAMILY_SEEDS), CI_JOBS))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "soak_cases" in metafunc.fixturenames:
        found = soak_batches(metafunc.config)
        metafunc.parametrize("soak_cases", [c for _, c in found], ids=[i for i, _ in found])


@pytest.fixture(scope="session")
def soak_pool() -> Iterator[concurrent.futures.ProcessPoolExecutor]:
    """The processes that run a batch's schedules at once (spawned: a fork of a test
    process with threads could inherit a held lock)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(CI_JOBS, mp_context=context) as pool:
        yield pool


def expected_cost(item: pytest.Item) -> float:
    """About how long one soak test takes: the real mounts first, then by operations
    (a lost_publish op waits on a crash, gc and replay: as long as ~20 others; a
    fast_tier op about as long as a mixed one)."""
    if "real" in item.name:
        return 1e6
    spec = getattr(item, "callspec", None)
    cases = spec.params.get("soak_cases") if spec is not None else None
    return float(max(n * (20 if f == "lost_publish" else 1) for f, _, n in cases)) if cases else 0.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest soak tests first: with -n, none of them is left to run alone at the
    end while the other workers idle (the order changes no test)."""
    soak = [i for i in items if "tests/soak/" in str(i.path).replace("\\", "/")]
    if not soak:
        return
    first = items.index(soak[0])
    rest = [i for i in items if i not in set(soak)]
    ordered = sorted(soak, key=expected_cost, reverse=True)
    items[:] = rest[:first] + ordered + rest[first:]
