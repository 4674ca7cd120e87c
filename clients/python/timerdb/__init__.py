"""timerdb: the Python client of the timerdb clustered timer database.

`Client` talks to any nodes of a cluster, follows the leader and retries idempotent calls;
`Consumer` (from `Client.consumer`) receives fired timers and acks them in batches. The
generated messages are in `timerdb.v1.timerdb_pb2` (re-exported here as `pb`).
"""

from timerdb.client import Client, Retry, TimerdbError
from timerdb.consumer import Consumer
from timerdb.v1 import timerdb_pb2 as pb

__all__ = ["Client", "Consumer", "Retry", "TimerdbError", "pb"]
