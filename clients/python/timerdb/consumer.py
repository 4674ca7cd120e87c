"""A consumer of one namespace's fired timers: resubscribes by itself, acks in batches.

A reader thread holds a Subscribe stream on one node; when the stream fails or ends (the node
stopped, leadership moved) it opens it again on the next node after a backoff, until closed.
Delivery is at-least-once: a delivery whose ack was not applied comes again (after the
namespace's ack timeout, with a higher attempt), and a resubscription can repeat one. Acks are
queued and sent together as AckBatch calls (retried: acks are idempotent); `flush()` waits
until every ack queued so far has its answer.

    with client.consumer("billing") as c:
        for delivery in c:
            handle(delivery.timer)
            c.ack(delivery)
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Iterator, Optional

import grpc

from timerdb.errors import TRANSIENT, Retry, TimerdbError
from timerdb.v1 import timerdb_pb2 as pb

_CLOSED = object()


class Consumer:
    def __init__(
        self,
        client: "timerdb.client.Client",  # it makes consumers (`Client.consumer`): not imported
        namespace: str,
        *,
        name: str = "timerdb-python",
        max_in_flight: int = 0,
        ack_linger: float = 0.01,
        ack_batch: int = 1000,
    ):
        self._client = client
        self._namespace = namespace
        self._request = pb.SubscribeRequest(namespace=namespace, consumer=name, max_in_flight=max_in_flight)
        self._deliveries: "queue.Queue" = queue.Queue(maxsize=10_000)
        self._acks: "queue.Queue" = queue.Queue()
        self._linger = ack_linger
        self._batch = ack_batch
        self._closed = threading.Event()
        self._call = None
        self._call_lock = threading.Lock()
        self.resubscribed = 0
        self.acked = 0
        self.refused: list = []
        self._reader = threading.Thread(target=self._read, daemon=True, name="timerdb-reader")
        self._acker = threading.Thread(target=self._ack_loop, daemon=True, name="timerdb-acker")
        self._reader.start()
        self._acker.start()

    # --- the caller's side ----------------------------------------------------------------

    def next(self, timeout: Optional[float] = None) -> Optional[pb.Delivery]:
        """The next delivery, or None after `timeout` seconds or once closed. Raises
        TimerdbError if the subscription was refused (no permission, a namespace that pushes)."""
        try:
            item = self._deliveries.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _CLOSED:
            self._deliveries.put(_CLOSED)
            return None
        if isinstance(item, TimerdbError):
            raise item
        return item

    def __iter__(self) -> Iterator[pb.Delivery]:
        while True:
            d = self.next()
            if d is None:
                return
            yield d

    def ack(self, delivery: pb.Delivery) -> None:
        """Queues the ack of `delivery` (sent with others shortly)."""
        self._acks.put(pb.AckRequest(namespace=self._namespace, id=delivery.timer.id, attempt=delivery.attempt))

    def flush(self, timeout: float = 60.0) -> None:
        """Waits until every ack queued before it has its answer (see `acked`, `refused`)."""
        done = threading.Event()
        self._acks.put(done)
        done.wait(timeout)

    def close(self) -> None:
        self.flush()
        self._closed.set()
        with self._call_lock:
            if self._call is not None:
                self._call.cancel()
        self._acks.put(None)
        self._deliveries.put(_CLOSED)

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the threads ----------------------------------------------------------------------

    def _read(self) -> None:
        nodes = self._client.nodes
        # First on the leader of the namespace's group, which serves the stream (any other node
        # relays it: one hop more).
        leader = self._client.leader_for(self._namespace) or self._client.leader_id
        start = next((i for i, n in enumerate(nodes) if n.node_id == leader), 0)
        backoff = Retry()
        failures = 0
        turn = 0
        while not self._closed.is_set():
            if turn > 0:
                self.resubscribed += 1
            node = nodes[(start + turn) % len(nodes)]
            turn += 1
            try:
                call = node.timers.Subscribe(self._request, metadata=self._client.metadata)
                with self._call_lock:
                    self._call = call
                for delivery in call:
                    failures = 0
                    self._deliveries.put(delivery)
            except grpc.RpcError as e:
                if self._closed.is_set():
                    return
                if e.code() not in TRANSIENT:
                    self._deliveries.put(TimerdbError(e.code(), e.details() or ""))
                    return
            failures += 1
            time.sleep(backoff.backoff(min(failures, 6)))

    def _ack_loop(self) -> None:
        while True:
            first = self._acks.get()
            if first is None:
                return
            batch, flushes = [], []
            (flushes if isinstance(first, threading.Event) else batch).append(first)
            deadline = time.monotonic() + self._linger
            while len(batch) < self._batch and not flushes:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    item = self._acks.get(timeout=left)
                except queue.Empty:
                    break
                if item is None:
                    self._acks.put(None)
                    break
                (flushes if isinstance(item, threading.Event) else batch).append(item)
            for i in range(0, len(batch), self._batch):
                self._send(batch[i : i + self._batch])
            for f in flushes:
                f.set()

    def _send(self, acks: list) -> None:
        try:
            reply = self._client.ack_batch(acks)
        except TimerdbError as e:
            self.refused.extend((a.id, a.attempt, e) for a in acks)
            return
        for a, r in zip(acks, reply.results):
            if r.code == 0:
                self.acked += 1
            else:
                self.refused.append((a.id, a.attempt, r.message))
