"""Hidden evaluation tests of rate_limiter: copied into the workspace only for the evaluation."""

import unittest

from ratelimit import TokenBucket


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


class TokenBucketTest(unittest.TestCase):
    def setUp(self):
        self.clock = FakeClock()
        self.bucket = TokenBucket(rate=1, capacity=2, clock=self.clock)

    def test_wait_time(self):
        self.bucket.allow()
        self.bucket.allow()
        self.assertAlmostEqual(self.bucket.wait_time(), 1.0)
        self.clock.advance(0.25)
        self.assertAlmostEqual(self.bucket.wait_time(), 0.75)
        self.assertAlmostEqual(self.bucket.wait_time(), 0.75)

if __name__ == "__main__":
    unittest.main()
