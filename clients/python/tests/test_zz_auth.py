"""Errors with auth on, as a grpc-core client (Python grpcio) sees them, on every node.

Issue 33 finding 11: with auth on, every answer to a call made with a key went through a body
wrapper that never said it had ended, so an error left as HEADERS and then an empty DATA frame
with END_STREAM instead of one closing HEADERS frame; grpc-core clients (Python, Go, Java)
reported every such error as UNKNOWN "Stream removed", and the client's retry rules, which go
by code, went wrong. Named to run after the other tests: it switches auth on, and off again.
"""

import os
import time
import unittest

import grpc

from timerdb import Client, TimerdbError, pb
from timerdb.v1 import timerdb_pb2_grpc as rpc

ADDRS = os.environ["TIMERDB_TEST_ADDRS"].split(",")


def bearer(token):
    return (("authorization", f"Bearer {token}"),)


def leader_addr(within=30.0):
    """The address of the node that leads (the setup's CreateKey is not safe to retry, so it
    goes straight there rather than through a follower during an election)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for addr in ADDRS:
            try:
                with grpc.insecure_channel(addr) as ch:
                    s = rpc.ClusterStub(ch).Status(pb.StatusRequest(), timeout=2)
                if s.role == "leader":
                    return addr
            except grpc.RpcError:
                pass
        time.sleep(0.1)
    raise AssertionError("no leader")


class AuthOnErrorsTest(unittest.TestCase):
    def setUp(self):
        self.channel = grpc.insecure_channel(leader_addr())
        access = rpc.AccessStub(self.channel)
        admin = access.CreateKey(pb.CreateKeyRequest(name="py-admin", roles=["admin"]))
        reader = access.CreateKey(pb.CreateKeyRequest(name="py-reader", roles=["read:pyauth*"]))
        self.admin, self.reader = admin.token, reader.token
        access.SetAuth(pb.SetAuthRequest(enabled=True), metadata=bearer(self.admin))
        self.access = access

    def tearDown(self):
        self.access.SetAuth(pb.SetAuthRequest(enabled=False), metadata=bearer(self.admin))
        self.channel.close()

    def code_of(self, call):
        with self.assertRaises(TimerdbError) as e:
            call()
        return e.exception.code

    def test_error_codes_reach_a_grpc_core_client_with_auth_on(self):
        admin = Client(ADDRS, token=self.admin)
        fired = admin.schedule("pyauth", "due", delay_ms=0)
        self.assertTrue(fired.created)
        deadline = time.monotonic() + 20
        while admin.get("pyauth", "due").state == pb.TIMER_STATE_PENDING:
            self.assertLess(time.monotonic(), deadline, "the timer never fired")
            time.sleep(0.05)
        # On each node: the leader answers itself; a follower forwards, and relays the answer.
        for addr in ADDRS:
            with self.subTest(node=addr):
                ch = grpc.insecure_channel(addr)
                timers = rpc.TimersStub(ch)
                with self.assertRaises(grpc.RpcError) as e:
                    timers.Get(pb.GetRequest(namespace="pyauth", id="nope"), metadata=bearer(self.admin))
                self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND, e.exception.details())
                with self.assertRaises(grpc.RpcError) as e:
                    timers.Cancel(pb.CancelRequest(namespace="pyauth", id="due"), metadata=bearer(self.admin))
                self.assertEqual(
                    e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION, e.exception.details()
                )
                with self.assertRaises(grpc.RpcError) as e:
                    timers.Schedule(
                        pb.ScheduleRequest(namespace="pyauth", id="x", delay_ms=1000),
                        metadata=bearer(self.reader),
                    )
                self.assertEqual(
                    e.exception.code(), grpc.StatusCode.PERMISSION_DENIED, e.exception.details()
                )
                with self.assertRaises(grpc.RpcError) as e:
                    timers.Get(pb.GetRequest(namespace="pyauth", id="due"), metadata=bearer("tdbk_no_such"))
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
                ch.close()
        # And through the client library, whose retry rules go by these codes.
        self.assertEqual(self.code_of(lambda: admin.get("pyauth", "nope")), grpc.StatusCode.NOT_FOUND)
        self.assertEqual(
            self.code_of(lambda: admin.cancel("pyauth", "due")), grpc.StatusCode.FAILED_PRECONDITION
        )
        reader = Client(ADDRS, token=self.reader)
        self.assertEqual(
            self.code_of(lambda: reader.schedule("pyauth", "y", delay_ms=1000)),
            grpc.StatusCode.PERMISSION_DENIED,
        )
        admin.close()
        reader.close()


if __name__ == "__main__":
    unittest.main()
