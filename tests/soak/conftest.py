"""Options of the soak tier: --seed N replays one schedule, --ops N sets its length."""

from __future__ import annotations

import pytest


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


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "soak_seed" not in metafunc.fixturenames:
        return
    from ci_seeds import CI_OPS, CI_SEEDS, FAMILY_SEEDS, REGRESSION_SEEDS

    seed = metafunc.config.getoption("--seed", default=None)
    ops = metafunc.config.getoption("--ops", default=None)
    family = metafunc.config.getoption("--family", default="mixed")
    if metafunc.function.__name__ == "test_family_seed":
        fcases = [] if seed is not None else FAMILY_SEEDS
        metafunc.parametrize("soak_family,soak_seed,soak_ops", fcases,
                             ids=[f"{f}-seed{s}x{n}" for f, s, n in fcases])
        return
    metafunc.parametrize("soak_family", [family if seed is not None else "mixed"])
    if seed is not None:
        cases = [] if metafunc.function.__name__ == "test_regression_seed" else [
            (seed, ops or CI_OPS)]
    elif metafunc.function.__name__ == "test_regression_seed":
        cases = [(s, n) for s, n, _ in REGRESSION_SEEDS]
    else:
        cases = [(s, CI_OPS) for s in CI_SEEDS]
    metafunc.parametrize("soak_seed,soak_ops", cases,
                         ids=[f"seed{s}x{n}" for s, n in cases])


def expected_cost(item: pytest.Item) -> float:
    """About how long one soak test takes (s): the real mounts, then by operations."""
    if "real" in item.name:
        return 1e6
    spec = getattr(item, "callspec", None)
    ops = spec.params.get("soak_ops") if spec is not None else None
    return float(ops) if isinstance(ops, int) else 0.0  # not set: a test --seed skips


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
