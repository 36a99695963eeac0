"""A token bucket: the one budget for what a client or an agent can make the
daemon write (audit records in audit/trail.py, lines about refused bus calls
in bus/calllog.py). `burst` at once, then `rate` a second."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Bucket:
    tokens: float
    rate: float
    burst: float
    at: float = field(default_factory=time.monotonic)

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False

    def give_back(self) -> None:
        self.tokens = min(self.burst, self.tokens + 1)
