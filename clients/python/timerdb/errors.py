"""What a call's failure is and how calls are retried: shared by `timerdb.client` and
`timerdb.consumer`, which stand on it (neither imports the other at load time)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import grpc

TRANSIENT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
    }
)


@dataclass(frozen=True)
class Retry:
    """Exponential backoff with jitter, bounded by attempts and by a deadline per call."""

    attempts: int = 12
    base: float = 0.05
    max_backoff: float = 2.0
    within: float = 30.0

    def backoff(self, n: int) -> float:
        """The pause before retry n (1-based): random in [cap/2, cap]."""
        cap = min(self.base * (2 ** min(n - 1, 16)), self.max_backoff)
        return random.uniform(cap / 2, cap)




class TimerdbError(Exception):
    """A call failed: `code` is the gRPC status code, `details` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    @property
    def outcome_unknown(self) -> bool:
        """True when the call may or may not have been applied."""
        return self.code in TRANSIENT
