"""The retry rule against the cases the Rust client and the server's forwarder share
(clients/idempotence.json): one rule, checked by both libraries."""

import json
import os
import unittest

from google.protobuf import json_format

from timerdb import idempotent, pb

CASES = os.path.join(os.path.dirname(__file__), "..", "..", "idempotence.json")


def request_of(method: str, body: dict):
    name = method.rsplit("/", 1)[1]
    cls = {"Pause": "PauseRequest", "Resume": "PauseRequest"}.get(name, f"{name}Request")
    return json_format.ParseDict(body, getattr(pb, cls)())


class IdempotenceTest(unittest.TestCase):
    def test_the_shared_cases_hold(self):
        with open(CASES) as f:
            cases = json.load(f)
        self.assertGreaterEqual(len(cases), 20)
        for c in cases:
            with self.subTest(method=c["method"], request=c["request"]):
                req = request_of(c["method"], c["request"])
                self.assertEqual(idempotent.retry_safe(c["method"], req), c["retry_safe"])

    def test_unknown_methods_are_not_safe(self):
        self.assertFalse(idempotent.retry_safe("/timerdb.v1.Timers/Frobnicate", pb.GetRequest()))
        self.assertFalse(idempotent.retry_safe("/other.Service/Get", pb.GetRequest()))


if __name__ == "__main__":
    unittest.main()
