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

    def test_burst_up_to_capacity(self):
        self.assertTrue(self.bucket.allow())
        self.assertTrue(self.bucket.allow())
        self.assertFalse(self.bucket.allow())

    def test_refills_at_rate(self):
        self.bucket.allow()
        self.bucket.allow()
        self.clock.advance(1.0)
        self.assertTrue(self.bucket.allow())
        self.assertFalse(self.bucket.allow())

    def test_denied_calls_do_not_earn_extra_tokens(self):
        self.bucket.allow()
        self.bucket.allow()
        self.clock.advance(0.5)
        self.assertFalse(self.bucket.allow())
        self.clock.advance(0.25)
        self.assertFalse(self.bucket.allow())
        self.clock.advance(0.25)
        self.assertTrue(self.bucket.allow())

    def test_polling_does_not_exceed_the_rate(self):
        allowed = 0
        for _ in range(600):  # one minute of polling every 100 ms
            allowed += self.bucket.allow()
            self.clock.advance(0.1)
        self.assertLessEqual(allowed, 2 + 60)
        self.assertGreaterEqual(allowed, 60)

    def test_idle_time_does_not_overfill(self):
        self.clock.advance(3600)
        self.assertEqual(sum(self.bucket.allow() for _ in range(5)), 2)

    def test_cost_above_capacity(self):
        with self.assertRaises(ValueError):
            self.bucket.allow(3)


if __name__ == "__main__":
    unittest.main()
