"""The Python client against a real sharded 3-node timerdb cluster (started by
clients/python/test.sh: 4 data groups beside group 0).

TIMERDB_TEST_ADDRS: the nodes' client ports; TIMERDB_TEST_CLUSTER: `scripts/cluster.sh` and
the cluster's --dir and --base-port, to kill and restart nodes.
"""

import os
import shlex
import subprocess
import threading
import time
import unittest

import grpc

from timerdb import Client, TimerdbError, pb
from timerdb.v1 import timerdb_pb2_grpc as rpc

ADDRS = os.environ["TIMERDB_TEST_ADDRS"].split(",")
CLUSTER = shlex.split(os.environ["TIMERDB_TEST_CLUSTER"])


def cluster(action, node):
    """`scripts/cluster.sh ACTION NODE --dir DIR --base-port PORT` (TIMERDB_BIN set)."""
    cmd = CLUSTER[:1] + [action, node] + CLUSTER[1:]
    subprocess.run(cmd, check=True, capture_output=True)


def forwarded():
    """Calls the nodes forwarded to another node's leader, summed (Status.calls_forwarded)."""
    total = 0
    for addr in ADDRS:
        with grpc.insecure_channel(addr) as ch:
            total += rpc.ClusterStub(ch).Status(pb.StatusRequest(), timeout=5).calls_forwarded
    return total


def group_leader(addr, group, within=30.0):
    """The leader of `group` as the node at `addr` knows it, once it knows one."""
    deadline = time.monotonic() + within
    with grpc.insecure_channel(addr) as ch:
        while time.monotonic() < deadline:
            leader = rpc.ClusterStub(ch).Slots(pb.SlotsRequest(), timeout=5).groups[group].leader_id
            if leader:
                return leader
            time.sleep(0.1)
    raise AssertionError(f"group {group} has no leader")


def wait_leader(client, within=30.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if client.refresh() and client.leader_id:
            return client.leader_id
        time.sleep(0.1)
    raise AssertionError("no leader")


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.client = Client(ADDRS)
        wait_leader(self.client)

    def tearDown(self):
        self.client.close()

    def test_calls_and_their_errors(self):
        c = self.client
        r = c.schedule("py", "a", delay_ms=600_000, json_payload={"customer": 7})
        self.assertTrue(r.created)
        self.assertEqual(r.timer.state, pb.TIMER_STATE_PENDING)
        self.assertEqual(r.timer.content_type, "application/json")
        again = c.schedule("py", "a", delay_ms=600_000, json_payload={"customer": 7})
        self.assertFalse(again.created, "an identical retry finds the timer")
        with self.assertRaises(TimerdbError) as e:
            c.schedule("py", "a", delay_ms=5, payload=b"other")
        self.assertEqual(e.exception.code, grpc.StatusCode.ALREADY_EXISTS)
        self.assertFalse(e.exception.outcome_unknown)
        self.assertEqual(c.get("py", "a").id, "a")
        with self.assertRaises(TimerdbError) as e:
            c.get("py", "nope")
        self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)
        moved = c.reschedule("py", "a", fire_at_ms=r.timer.fire_at_ms + 1000)
        self.assertEqual(moved.fire_at_ms, r.timer.fire_at_ms + 1000)
        pending = c.list_all("py", state=pb.TIMER_STATE_PENDING)
        self.assertIn("a", [t.id for t in pending])
        self.assertEqual(c.cancel("py", "a").state, pb.TIMER_STATE_CANCELLED)
        self.assertEqual(c.cancel("py", "a").state, pb.TIMER_STATE_CANCELLED, "a retried cancel")
        batch = [pb.ScheduleRequest(namespace="py", id=f"b{i}", delay_ms=600_000) for i in range(5)]
        self.assertEqual(len(c.schedule_batch(batch).results), 5)
        with self.assertRaises(TimerdbError) as e:
            c.schedule("py", "", delay_ms=5)
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(c.status().node_id, c.leader_id, "calls go to the leader")

    def test_each_call_goes_to_its_groups_leader_and_follows_it(self):
        c = self.client
        ns = "py-routed"
        self.assertEqual(c.map_epoch, 1)
        group = c._group_of(ns)
        self.assertIsNotNone(group)
        self.assertNotEqual(group, 0, "a namespace's timers are in a data group")
        # The group's leader is not group 0's, so a call sent to group 0's leader is forwarded.
        meta = group_leader(ADDRS[0], 0)
        lead = next(i for i in (1, 2, 3) if i != meta)
        self._move(group, lead)
        c.refresh()
        self.assertEqual(c.leader_for(ns), lead)
        before = forwarded()
        for i in range(10):
            c.schedule(ns, f"a{i}", delay_ms=600_000)
            c.get(ns, f"a{i}")
        c.schedule_batch([pb.ScheduleRequest(namespace=ns, id=f"b{i}", delay_ms=600_000) for i in range(5)])
        c.cancel(ns, "a0")
        self.assertEqual(forwarded() - before, 0, "every call went to its group's leader")
        # The leader moves: the next call is forwarded once, and its answer says to whom.
        nxt = next(i for i in (1, 2, 3) if i != lead)
        self._move(group, nxt)
        before = forwarded()
        c.schedule(ns, "c0", delay_ms=600_000)
        self.assertEqual(forwarded() - before, 1)
        self.assertEqual(c.leader_for(ns), nxt)
        for i in range(1, 10):
            c.schedule(ns, f"c{i}", delay_ms=600_000)
        self.assertEqual(forwarded() - before, 1, "then straight to the new leader")

    def _move(self, group, to):
        """Moves `group`'s leader to node `to`, and waits until every node knows it."""
        with grpc.insecure_channel(ADDRS[to - 1]) as ch:
            rpc.ClusterStub(ch).TransferLeader(pb.TransferLeaderRequest(node_id=to, group=group), timeout=30)
        for addr in ADDRS:
            deadline = time.monotonic() + 30
            while group_leader(addr, group) != to:
                self.assertLess(time.monotonic(), deadline, f"{addr} never learned")
                time.sleep(0.05)

    def test_a_consumer_receives_and_acks_every_timer(self):
        c = self.client
        c.put_namespace("py-consume", pb.NamespacePolicy(ack_timeout_ms=3000))
        ids = {f"c{i}" for i in range(60)}
        for i in ids:
            c.schedule("py-consume", i, delay_ms=200, payload=b"x")
        seen = set()
        with c.consumer("py-consume", name="py-test", max_in_flight=100) as consumer:
            while seen != ids:
                d = consumer.next(timeout=30)
                self.assertIsNotNone(d, f"{len(seen)} of {len(ids)} delivered")
                consumer.ack(d)
                seen.add(d.timer.id)
            consumer.flush()
            self.assertGreaterEqual(consumer.acked, len(ids))
        acked = {t.id for t in c.list_all("py-consume", state=pb.TIMER_STATE_ACKED)}
        self.assertEqual(acked, ids)

    def test_through_a_leader_kill(self):
        """Every schedule answered OK once (retries hidden), the consumer resumes elsewhere."""
        c = self.client
        ns = "py-kill"
        c.put_namespace(ns, pb.NamespacePolicy(ack_timeout_ms=3000))
        # The leader of the group holding the namespace's timers: its writes and its stream.
        c.refresh()
        leader = c.leader_for(ns)
        self.assertIsNotNone(leader)
        consumer = c.consumer(ns, name="py-kill", max_in_flight=2000)
        answers, errors = {}, []

        def write(w):
            for i in range(100):
                tid = f"w{w}-{i}"
                try:
                    answers[tid] = c.schedule(ns, tid, delay_ms=1500, payload=b"x")
                except TimerdbError as e:
                    errors.append((tid, e))

        writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
        for t in writers:
            t.start()
        time.sleep(0.3)
        cluster("kill", str(leader))
        for t in writers:
            t.join()
        try:
            self.assertEqual(errors, [])
            self.assertEqual(len(answers), 400)
            retried = sum(1 for r in answers.values() if not r.created)
            print(f"\n400 schedules answered OK once each ({retried} by a retry finding the timer)")
            seen = set()
            while len(seen) < 400:
                d = consumer.next(timeout=60)
                self.assertIsNotNone(d, f"{len(seen)} of 400 delivered")
                consumer.ack(d)
                seen.add(d.timer.id)
            consumer.flush()
            self.assertGreaterEqual(consumer.resubscribed, 1, "the stream moved off the killed leader")
            acked = {t.id for t in c.list_all(ns, state=pb.TIMER_STATE_ACKED)}
            self.assertEqual(acked, set(answers))
            wait_leader(c)
            self.assertIsNotNone(c.leader_for(ns), "the group's new leader is known")
            self.assertNotEqual(c.leader_for(ns), leader)
        finally:
            consumer.close()
            cluster("restart", str(leader))


if __name__ == "__main__":
    unittest.main()
