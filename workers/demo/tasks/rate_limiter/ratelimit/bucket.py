"""A token-bucket rate limiter."""

import time
from collections.abc import Callable


class TokenBucket:
    """Allows `rate` events per second on average and bursts of up to `capacity`. `clock` returns
    seconds from a monotonic clock; tests pass a fake one. Not thread-safe."""

    def __init__(self, *, rate: float, capacity: float, clock: Callable[[], float] = time.monotonic):
        if rate <= 0 or capacity <= 0:
            raise ValueError("rate and capacity must be positive")
        self.rate = rate
        self.capacity = capacity
        self._clock = clock
        self._tokens = capacity
        self._updated = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._updated) * self.rate)

    def allow(self, cost: float = 1.0) -> bool:
        """Take `cost` tokens if they are there. Never blocks."""
        if cost > self.capacity:
            raise ValueError("cost exceeds capacity")
        self._refill()
        if self._tokens >= cost:
            self._tokens -= cost
            self._updated = self._clock()
            return True
        return False

    def wait_time(self, cost: float = 1.0) -> float:
        """Seconds until allow(cost) would succeed."""
        self._refill()
        return max(0.0, (cost - self._tokens) / self.rate)
