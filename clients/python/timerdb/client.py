"""The timerdb client: any node, the leader followed, idempotent calls retried.

The same rules as the Rust client (clients/rust): the client is given some nodes of a cluster,
learns from their Cluster.Status each one's id and which one leads, and sends calls to the
leader (a follower would forward them; one hop saved). A call that fails with a status that
leaves its outcome open or says "not now" (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, UNKNOWN)
is sent again, to the next node, after an exponential backoff with jitter, if the call is
idempotent: Schedule creating a timer, ScheduleBatch, an unconditional Cancel, Ack, Get, List
and the namespace reads (`timerdb.idempotent`). Other calls (Reschedule, Nack, Redrive,
conditional calls, policy changes) are sent again only when the node said it did nothing
(`x-timerdb-not-applied`: not proposed, e.g. no leader yet); any other failure is raised as it
is: an unknown outcome the caller must judge.

In a sharded cluster (docs/sharding.md) each Raft group has its own leader. The client also
learns the slot map (Cluster.Slots) and sends a call naming a namespace to the leader of the
group holding the namespace's timers (its hash slot: `timerdb.hash_slot`). Any node would
forward it; the answer of a forwarded call names the node that served it
(`x-timerdb-served-by`), and the client sends the next call there. A server without groups
answers no map (UNIMPLEMENTED): every call then goes to the one leader.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence, TypeVar

import grpc

from timerdb import idempotent
from timerdb.hash_slot import hash_slot
from timerdb.errors import TRANSIENT, Retry, TimerdbError
from timerdb.v1 import timerdb_pb2 as pb
from timerdb.v1 import timerdb_pb2_grpc as rpc

T = TypeVar("T")

# Set by a node on an UNAVAILABLE answer to a call it did not propose: safe to send again.
NOT_APPLIED = "x-timerdb-not-applied"
# Set by a node on an answer it forwarded: the id of the leader that served it.
SERVED_BY = "x-timerdb-served-by"

NEVER = Retry(attempts=1)


@dataclass
class _Node:
    addr: str
    channel: grpc.Channel
    timers: rpc.TimersStub
    namespaces: rpc.NamespacesStub
    cluster: rpc.ClusterStub
    node_id: Optional[int] = None


class Client:
    """A client of one timerdb cluster (thread-safe).

    `addrs` are client ports (`HOST:PORT`). With `root_certificates` (PEM bytes) the
    connections use TLS, presenting `certificate_chain` and `private_key` if given (mTLS).
    `token` is an API key sent as `authorization: Bearer` once auth is on.
    """

    def __init__(
        self,
        addrs: Sequence[str],
        *,
        token: Optional[str] = None,
        root_certificates: Optional[bytes] = None,
        certificate_chain: Optional[bytes] = None,
        private_key: Optional[bytes] = None,
        retry: Retry = Retry(),
        timeout: float = 10.0,
    ):
        if not addrs:
            raise ValueError("no node address given")
        self._retry = retry
        self._timeout = timeout
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._lock = threading.Lock()
        self._leader: Optional[int] = None
        self._next = 0
        # The slot map: (first hash slot, one past the last, group) ranges, each group's
        # (leader by node id or None, term known in), and the epoch (None: no map, a server
        # before groups).
        self._ranges: list = []
        self._group_leaders: dict = {}
        self._epoch: Optional[int] = None
        self._nodes = []
        for addr in addrs:
            if root_certificates is not None or certificate_chain is not None:
                creds = grpc.ssl_channel_credentials(
                    root_certificates, private_key, certificate_chain
                )
                ch = grpc.secure_channel(addr, creds)
            else:
                ch = grpc.insecure_channel(addr)
            self._nodes.append(
                _Node(addr, ch, rpc.TimersStub(ch), rpc.NamespacesStub(ch), rpc.ClusterStub(ch))
            )
        if not self.refresh():
            raise TimerdbError(
                grpc.StatusCode.UNAVAILABLE, "no node answered: " + ", ".join(addrs)
            )

    def close(self) -> None:
        for n in self._nodes:
            n.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- leader following ---------------------------------------------------------------

    def refresh(self) -> bool:
        """Asks every node its Status; learns ids and the leader. True if any answered."""
        leader_id = None
        answered = []
        for n in self._nodes:
            try:
                s = n.cluster.Status(pb.StatusRequest(), timeout=1.0, metadata=self._metadata)
            except grpc.RpcError:
                continue
            answered.append(n)
            n.node_id = s.node_id
            if s.role == "leader":
                leader_id = s.node_id
            elif s.leader_id and leader_id is None:
                leader_id = s.leader_id
        learned = self._slots(answered)
        with self._lock:
            self._leader = next(
                (i for i, n in enumerate(self._nodes) if leader_id and n.node_id == leader_id),
                None,
            )
            if learned == "no groups":
                self._epoch, self._ranges, self._group_leaders = None, [], {}
            elif learned is not None:
                self._merge(learned)
        return bool(answered)

    def _merge(self, slots) -> None:
        """Takes in a map one node gave: the newer epoch's hash slots, and per group the entry
        of the later term (at one term, a leader this client saw fail stays unknown). Called
        with the lock held."""
        if self._epoch is None or slots.epoch >= self._epoch:
            self._epoch = slots.epoch
            self._ranges = [(r.start, r.end, g.group) for g in slots.groups for r in g.hash_slots]
        for g in slots.groups:
            known = self._group_leaders.get(g.group)
            if known and (known[1] > g.term or (known[1] == g.term and known[0] is None)):
                continue
            self._group_leaders[g.group] = (g.leader_id or None, g.term)

    def _slots(self, answered):
        """The slot map from the first of `answered` that gives one; "no groups" when they
        are all builds before groups; None when none answered."""
        learned = None
        for n in answered:
            try:
                return n.cluster.Slots(pb.SlotsRequest(), timeout=1.0, metadata=self._metadata)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                    learned = "no groups"
        return learned

    @property
    def map_epoch(self) -> Optional[int]:
        """The slot map's epoch as last learned (None: no data groups)."""
        with self._lock:
            return self._epoch

    def _group_of(self, namespace: str) -> Optional[int]:
        h = hash_slot(namespace, "")
        return next((g for start, end, g in self._ranges if start <= h < end), None)

    def leader_for(self, namespace: str) -> Optional[int]:
        """The id of the node believed to lead the group holding `namespace`'s timers."""
        with self._lock:
            return self._group_leaders.get(self._group_of(namespace), (None, 0))[0]

    def current_for(self, namespace: str) -> str:
        """The address a call naming `namespace` goes to next."""
        return self._nodes[self._pick(namespace)].addr

    @property
    def leader_id(self) -> Optional[int]:
        with self._lock:
            return None if self._leader is None else self._nodes[self._leader].node_id

    def _pick(self, namespace: Optional[str] = None) -> int:
        """The leader of `namespace`'s group if known, else the leader, else the next node."""
        with self._lock:
            if namespace is not None:
                leader = self._group_leaders.get(self._group_of(namespace), (None, 0))[0]
                i = next((i for i, n in enumerate(self._nodes) if leader and n.node_id == leader), None)
                if i is not None:
                    return i
            return self._leader if self._leader is not None else self._next % len(self._nodes)

    def _passed_over(self, i: int) -> None:
        with self._lock:
            if self._leader == i:
                self._leader = None
            failed = self._nodes[i].node_id
            self._group_leaders = {
                g: (None if leader == failed else leader, term)
                for g, (leader, term) in self._group_leaders.items()
            }
            self._next = i + 1

    def call(self, idempotent: bool, fn: Callable[[_Node, float, tuple], T]) -> T:
        """Runs `fn(node, timeout, metadata)`, retried under the policy if `idempotent`."""
        return self.call_in(None, idempotent, lambda n, t, m: (fn(n, t, m), None))

    def call_in(self, namespace: Optional[str], idempotent: bool, fn) -> T:
        """`call` of a call naming `namespace`, sent to its group's leader when known.

        `fn(node, timeout, metadata)` returns `(response, call)`, as a stub's `with_call` does
        (`call` None: no metadata to read); the answer's `x-timerdb-served-by` says who leads
        the group now.
        """
        retry = self._retry
        started = time.monotonic()
        attempt = 0
        while True:
            i = self._pick(namespace)
            try:
                response, rpc_call = fn(self._nodes[i], self._timeout, self._metadata)
                served_by = next(
                    (v for k, v in (rpc_call.initial_metadata() if rpc_call else ()) if k == SERVED_BY),
                    None,
                )
                if namespace is not None and served_by and served_by.isdigit():
                    with self._lock:
                        group = self._group_of(namespace)
                        leader, term = self._group_leaders.get(group, (None, 0))
                        # Another leader than the one known: elected in a later term.
                        if group is not None and leader != int(served_by):
                            self._group_leaders[group] = (int(served_by), term + 1)
                return response
            except grpc.RpcError as e:
                code, details = e.code(), e.details() or ""
                trailers = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
                did_nothing = any(k == NOT_APPLIED for k, _ in (trailers or ()))
            attempt += 1
            if code not in TRANSIENT:
                raise TimerdbError(code, details)
            # The node failed: the next call, sent again or not, goes elsewhere.
            self._passed_over(i)
            if not (idempotent or did_nothing):
                raise TimerdbError(code, details)
            pause = retry.backoff(attempt)
            if attempt >= retry.attempts or time.monotonic() - started + pause > retry.within:
                raise TimerdbError(code, details)
            time.sleep(pause)
            if attempt % 2 == 1:
                self.refresh()

    # --- Timers ---------------------------------------------------------------------------

    def schedule(
        self,
        namespace: str,
        id: str,
        *,
        delay_ms: Optional[int] = None,
        fire_at_ms: Optional[int] = None,
        payload: bytes | str | None = None,
        json_payload=None,
        content_type: str = "",
        mode: int = pb.CREATE_MODE_UNSPECIFIED,
        recurrence: Optional[pb.Recurrence] = None,
    ) -> pb.ScheduleResponse:
        """Creates a timer (retried: idempotent on namespace and id).

        Give `delay_ms` or `fire_at_ms` (or a `recurrence`). `json_payload` is any JSON value,
        sent as the payload with content type application/json.
        """
        req = pb.ScheduleRequest(
            namespace=namespace, id=id, content_type=content_type, mode=mode
        )
        if delay_ms is not None:
            req.delay_ms = delay_ms
        if fire_at_ms is not None:
            req.fire_at_ms = fire_at_ms
        if json_payload is not None:
            req.payload = json.dumps(json_payload).encode()
            req.content_type = content_type or "application/json"
        elif payload is not None:
            req.payload = payload.encode() if isinstance(payload, str) else payload
        if recurrence is not None:
            req.recurrence.CopyFrom(recurrence)
        return self.call_in(namespace, idempotent.schedule(req), lambda n, t, m: n.timers.Schedule.with_call(req, timeout=t, metadata=m))

    def schedule_batch(self, requests: Iterable[pb.ScheduleRequest]) -> pb.ScheduleBatchResponse:
        """Creates many timers in one write, all or none (retried)."""
        req = pb.ScheduleBatchRequest(timers=list(requests))
        return self.call_in(req.timers[0].namespace if req.timers else None, True, lambda n, t, m: n.timers.ScheduleBatch.with_call(req, timeout=t, metadata=m))

    def cancel(self, namespace: str, id: str, *, if_revision: int = 0) -> pb.Timer:
        """Cancels a timer; definitive (retried unless conditional)."""
        req = pb.CancelRequest(namespace=namespace, id=id, if_revision=if_revision)
        r = self.call_in(namespace, idempotent.cancel(req), lambda n, t, m: n.timers.Cancel.with_call(req, timeout=t, metadata=m))
        return r.timer

    def reschedule(
        self, namespace: str, id: str, *, delay_ms: Optional[int] = None, fire_at_ms: Optional[int] = None
    ) -> pb.Timer:
        """Moves a timer (sent once: a repeat could shift it twice, or be refused after a fire)."""
        req = pb.RescheduleRequest(namespace=namespace, id=id)
        if delay_ms is not None:
            req.delay_ms = delay_ms
        if fire_at_ms is not None:
            req.fire_at_ms = fire_at_ms
        r = self.call_in(namespace, False, lambda n, t, m: n.timers.Reschedule.with_call(req, timeout=t, metadata=m))
        return r.timer

    def get(self, namespace: str, id: str) -> pb.Timer:
        req = pb.GetRequest(namespace=namespace, id=id)
        return self.call_in(namespace, True, lambda n, t, m: n.timers.Get.with_call(req, timeout=t, metadata=m)).timer

    def list(self, namespace: str, *, state: int = 0, limit: int = 0, page_token: str = "") -> pb.ListResponse:
        req = pb.ListRequest(namespace=namespace, state=state, limit=limit, page_token=page_token)
        return self.call_in(namespace, True, lambda n, t, m: n.timers.List.with_call(req, timeout=t, metadata=m))

    def list_all(self, namespace: str, *, state: int = 0) -> list:
        """Every timer of the namespace in `state`, all pages."""
        out, token = [], ""
        while True:
            page = self.list(namespace, state=state, limit=1000, page_token=token)
            out.extend(page.timers)
            token = page.next_page_token
            if not token:
                return out

    def ack(self, namespace: str, id: str, attempt: int, wait_for_commit: bool = True) -> pb.Timer:
        """Acknowledges one delivery (retried: acking an acked timer succeeds again).

        By default waits until the ack has applied and returns the ACKED timer. With
        `wait_for_commit=False` it is answered once the leader has queued it (the timer as it
        was, still FIRED): faster, and an ack lost with a failing leader means a redelivery.
        """
        req = pb.AckRequest(namespace=namespace, id=id, attempt=attempt, wait_for_commit=wait_for_commit)
        return self.call_in(namespace, True, lambda n, t, m: n.timers.Ack.with_call(req, timeout=t, metadata=m)).timer

    def ack_batch(self, acks: Iterable[pb.AckRequest]) -> pb.AckBatchResponse:
        req = pb.AckBatchRequest(acks=list(acks))
        return self.call_in(req.acks[0].namespace if req.acks else None, True, lambda n, t, m: n.timers.AckBatch.with_call(req, timeout=t, metadata=m))

    def nack(self, namespace: str, id: str, attempt: int) -> pb.Timer:
        """Gives up on one delivery (sent once)."""
        req = pb.NackRequest(namespace=namespace, id=id, attempt=attempt)
        return self.call_in(namespace, False, lambda n, t, m: n.timers.Nack.with_call(req, timeout=t, metadata=m)).timer

    def redrive(self, namespace: str, id: str = "", *, all: bool = False) -> pb.RedriveResponse:
        req = pb.RedriveRequest(namespace=namespace, id=id, all=all)
        # Sent once: a repeat of a one-timer redrive is refused once it happened, one of a
        # namespace would redrive timers that went DEAD since.
        return self.call_in(namespace, False, lambda n, t, m: n.timers.Redrive.with_call(req, timeout=t, metadata=m))

    # --- Namespaces and Cluster -----------------------------------------------------------

    def put_namespace(self, name: str, policy: pb.NamespacePolicy) -> pb.Namespace:
        req = pb.PutNamespaceRequest(name=name, policy=policy)
        # Sent once: a repeat could undo someone's later change of the policy.
        return self.call(False, lambda n, t, m: n.namespaces.PutNamespace(req, timeout=t, metadata=m)).namespace

    def get_namespace(self, name: str) -> pb.Namespace:
        req = pb.GetNamespaceRequest(name=name)
        return self.call(True, lambda n, t, m: n.namespaces.GetNamespace(req, timeout=t, metadata=m)).namespace

    def status(self) -> pb.StatusResponse:
        """The Status of the node calls go to (the leader when known)."""
        req = pb.StatusRequest()
        return self.call(True, lambda n, t, m: n.cluster.Status(req, timeout=t, metadata=m))

    # --- consuming ------------------------------------------------------------------------

    def consumer(self, namespace: str, **options) -> "Consumer":
        """A consumer of the namespace's fired timers (see `timerdb.consumer.Consumer`)."""
        from timerdb.consumer import Consumer

        return Consumer(self, namespace, **options)

    @property
    def nodes(self) -> list:
        return list(self._nodes)

    @property
    def metadata(self) -> tuple:
        return self._metadata
