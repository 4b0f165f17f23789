"""retry: the backoff schedules and the in-place retry of transient store errors."""

from __future__ import annotations

import pytest
import trio

from ckptfs.common import retry
from ckptfs.common.errors import NotFoundError, PermanentStoreError, TransientStoreError
from ckptfs.common.retry import Backoff, retrying, retrying_async


def test_backoff_doubles_up_to_the_maximum_with_jitter() -> None:
    delays = list(Backoff(first=1.0, maximum=8.0, attempts=7).delays())
    assert len(delays) == 6  # one wait between two tries
    for delay, base in zip(delays, [1, 2, 4, 8, 8, 8], strict=True):
        assert 0.5 * base <= delay < 1.5 * base, delays


def test_backoff_without_a_limit_goes_on() -> None:
    waits = Backoff(first=0.1, maximum=30.0).delays()
    assert len([next(waits) for _ in range(100)]) == 100
    assert list(Backoff(first=1.0, maximum=1.0, attempts=1).delays()) == []


def test_store_call_schedule_is_a_few_seconds() -> None:
    """STORE_CALL retries a metadata request in place for about 3 s (docs/OPERATIONS.md):
    long enough to ride out throttling, short enough not to hang a file call."""
    bases = [0.1, 0.2, 0.4, 0.8, 1.6]
    assert retry.STORE_CALL.attempts == len(bases) + 1
    total = sum(retry.STORE_CALL.delays())
    assert 0.5 * sum(bases) <= total < 1.5 * sum(bases)


class Flaky:
    """Fails with each error of `errors` in turn, then returns 'ok'."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self, *args: object) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


FAST = Backoff(first=0.001, maximum=0.001, attempts=4)


def test_retrying_retries_transient_errors_only() -> None:
    flaky = Flaky(TransientStoreError("503"), TransientStoreError("503"))
    assert retrying(flaky, FAST)("x") == "ok" and flaky.calls == 3
    gone = Flaky(PermanentStoreError("no such bucket"))
    with pytest.raises(PermanentStoreError):
        retrying(gone, FAST)()
    assert gone.calls == 1  # permanent: not retried
    missing = Flaky(NotFoundError("k"))
    with pytest.raises(NotFoundError):
        retrying(missing, FAST)()
    assert missing.calls == 1
    down = Flaky(*[TransientStoreError("down")] * 10)
    with pytest.raises(TransientStoreError):
        retrying(down, FAST)()
    assert down.calls == 4  # `attempts` tries in all, the last error raised


def test_retrying_async() -> None:
    async def main() -> None:
        flaky = Flaky(TransientStoreError("503"))

        async def call(arg: str) -> str:
            assert arg == "x"
            return flaky()

        assert await retrying_async(call, "x", policy=FAST) == "ok" and flaky.calls == 2
        down = Flaky(*[TransientStoreError("down")] * 10)

        async def call_down() -> str:
            return down()

        with pytest.raises(TransientStoreError):
            await retrying_async(call_down, policy=FAST)
        assert down.calls == 4
        gone = Flaky(PermanentStoreError("denied"))

        async def call_gone() -> str:
            return gone()

        with pytest.raises(PermanentStoreError):
            await retrying_async(call_gone, policy=FAST)
        assert gone.calls == 1

    trio.run(main)
