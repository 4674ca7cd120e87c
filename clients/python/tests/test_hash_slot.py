"""The hash-slot rule against the cases the server and the Rust client share
(clients/hash_slots.json): one rule, checked by every implementation."""

import json
import os
import unittest

from timerdb import hash_slot

CASES = os.path.join(os.path.dirname(__file__), "..", "..", "hash_slots.json")


class HashSlotTest(unittest.TestCase):
    def test_the_shared_cases_hold(self):
        with open(CASES, encoding="utf-8") as f:
            cases = json.load(f)
        self.assertGreaterEqual(len(cases), 20)
        for c in cases:
            with self.subTest(case=c):
                self.assertEqual(hash_slot.routing_key(c["id"]), c["routing_key"])
                got = hash_slot.hash_slot(c["namespace"], c["id"], c["placement"])
                self.assertEqual(got, c["hash_slot"])

    def test_a_pinned_namespace_is_one_hash_slot(self):
        slots = {hash_slot.hash_slot("orders", f"o{i}") for i in range(1000)}
        self.assertEqual(len(slots), 1)
        spread = {hash_slot.hash_slot("orders", f"o{i}", "spread") for i in range(10000)}
        self.assertGreater(len(spread), 1000)

    def test_an_unknown_placement_is_refused(self):
        with self.assertRaises(ValueError):
            hash_slot.hash_slot("orders", "o1", "sharded")


if __name__ == "__main__":
    unittest.main()
