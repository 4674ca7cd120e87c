"""The web console in a real headless browser (Debian's chromium driven by Playwright) against
a real 3-node cluster (started by tests/console/run.sh): every page loads with the cluster's
figures, a dead letter is redriven from the UI, a read-only key sees the button disabled (and
the server would refuse it), and a screenshot of each page is saved.

Env: TIMERDB_TEST_ADDRS (client ports), TIMERDB_SHOTS (where screenshots go), CHROMIUM.
"""

import base64
import json
import os
import time
import unittest
import urllib.error
import urllib.request

from playwright.sync_api import expect, sync_playwright

ADDRS = os.environ["TIMERDB_TEST_ADDRS"].split(",")
BASE = f"http://{ADDRS[0]}"
SHOTS = os.environ["TIMERDB_SHOTS"]
NS = "console"


def call(method, path, body=None, token=None, addr=ADDRS[0]):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{addr}{path}", data=data, method=method)
    if token:
        req.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def ok(method, path, body=None, token=None):
    status, v = call(method, path, body, token)
    assert status == 200, f"{method} {path}: {status} {v}"
    return v


def wait(cond, what, within=30.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


class ConsoleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        os.makedirs(SHOTS, exist_ok=True)
        # Dead letters: one attempt each, pushed to a port nobody listens on.
        policy = {"max_attempts": 1, "ack_timeout_ms": 2000, "push": {"url": "http://127.0.0.1:9/hook"}}
        ok("PUT", f"/v1/namespaces/{NS}-dead", {"policy": policy})
        for i in range(3):
            ok("POST", f"/v1/namespaces/{NS}-dead/timers",
               {"id": f"lost-{i}", "delay_ms": 0, "payload_json": {"order": i}})
        # Pending timers over two pages, and a stream of fires for the charts.
        batch = [{"id": f"later-{i:03}", "delay_ms": 3_600_000, "payload": ""} for i in range(70)]
        ok("POST", f"/v1/namespaces/{NS}/timers:batch", {"timers": batch})
        soon = [{"id": f"soon-{i:03}", "delay_ms": 500 + 100 * i, "payload": ""} for i in range(150)]
        ok("POST", f"/v1/namespaces/{NS}-fires/timers:batch", {"timers": soon})
        wait(lambda: len(ok("GET", f"/v1/namespaces/{NS}-dead/timers?state=dead")["timers"]) == 3,
             "3 dead letters")
        cls.pw = sync_playwright().start()
        cls.browser = cls.pw.chromium.launch(
            executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
            args=["--no-sandbox", "--disable-dev-shm-usage"])

    @classmethod
    def tearDownClass(cls):
        cls.browser.close()
        cls.pw.stop()

    def open(self, route, token=None):
        page = self.browser.new_page(viewport={"width": 1280, "height": 800})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        # The page's policy refuses inline styles and scripts: what it blocks is not drawn.
        page.on("console", lambda m: errors.append(m.text) if "Content Security Policy" in m.text else None)
        self.addCleanup(lambda: self.assertEqual(errors, [], "script errors in the console"))
        self.addCleanup(page.close)
        if token:
            page.goto(f"{BASE}/console/")
            page.evaluate("t => sessionStorage.setItem('timerdb-token', t)", token)
        page.goto(f"{BASE}/console/#/{route}")
        if token:
            page.reload()  # the console reads the key when it loads
        name = route.split("?")[0]
        expect(page.locator("body")).to_have_attribute("data-loaded", name, timeout=15_000)
        return page

    def shot(self, page, name):
        page.screenshot(path=os.path.join(SHOTS, f"{name}.png"), full_page=True)

    def test_1_cluster(self):
        page = self.open("cluster")
        expect(page.locator("#members tr[data-node]")).to_have_count(3)
        expect(page.locator("#members tr.leader")).to_have_count(1)
        status = ok("GET", "/v1/cluster/status")
        expect(page.locator("#leader")).to_have_text(f"node {status['leader_id']}")
        # The slot map: group 0 and 4 data groups, whose hash slots cover 0..1024 once, each
        # row's leader the one the node reports, and a namespace's timers in the group the
        # map gives its hash slot.
        slots = ok("GET", "/v1/cluster/slots")
        self.assertEqual([g["group"] for g in slots["groups"]], [0, 1, 2, 3, 4])
        covered = sorted((r["start"], r["end"]) for g in slots["groups"] for r in g.get("hash_slots", []))
        self.assertEqual(covered[0][0], 0)
        self.assertEqual(covered[-1][1], 1024)
        self.assertTrue(all(a[1] == b[0] for a, b in zip(covered, covered[1:])), covered)
        expect(page.locator("#groups tr[data-group]")).to_have_count(5)
        expect(page.locator("#slotmap .hslots")).to_have_count(4)
        # Drawn: each group's part of the bar as wide as its share (a quarter), and coloured.
        widths = [b["width"] for b in (page.locator("#slotmap .hslots").nth(i).bounding_box() for i in range(4))]
        self.assertTrue(all(abs(w - sum(widths) / 4) < 4 for w in widths) and sum(widths) > 600, widths)
        colour = page.locator("#slotmap .hslots").first.evaluate("e => getComputedStyle(e).backgroundColor")
        self.assertNotIn(colour, ("rgba(0, 0, 0, 0)", "transparent"), colour)
        for g in slots["groups"]:
            leader = wait(lambda: ok("GET", "/v1/cluster/slots")["groups"][g["group"]].get("leader_id"),
                          f"group {g['group']}'s leader")
            page.reload()
            expect(page.locator("body")).to_have_attribute("data-loaded", "cluster", timeout=15_000)
            expect(page.locator(f"#groups tr[data-group='{g['group']}'] .leader-of")).to_have_text(f"node {leader}")
        overview = ok("GET", "/v1/cluster/overview")
        group_of = {n["name"]: n.get("group", 0) for n in overview["namespaces"]}
        pending = {g["group"]: int(g.get("pending_timers", 0)) for g in slots["groups"]}
        self.assertGreaterEqual(pending[group_of[NS]], 70, (group_of, pending))
        self.assertEqual(pending[0], 0, "group 0 holds no timers in a sharded cluster")
        self.assertEqual(page.locator("#error").count(), 0)
        self.shot(page, "cluster")

    def test_2_namespaces(self):
        page = self.open("namespaces")
        row = page.locator(f"#namespaces tr[data-ns='{NS}']")
        expect(row.locator(".pending")).to_have_text("70")
        dead_row = page.locator(f"#namespaces tr[data-ns='{NS}-dead']")
        expect(dead_row.locator(".dead")).to_have_text("3")
        expect(dead_row.locator(".pending")).to_have_text("0")
        expect(page.locator(f"#namespaces tr[data-ns='{NS}-dead']")).to_contain_text("push http://127.0.0.1:9/hook")
        group = {n["name"]: n.get("group", 0) for n in ok("GET", "/v1/cluster/overview")["namespaces"]}[NS]
        self.assertNotEqual(group, 0, "a namespace's timers are in a data group")
        expect(row.locator(".group")).to_have_text(str(group))
        self.shot(page, "namespaces")

    def test_3_timers_paged_and_a_timer(self):
        page = self.open(f"timers?ns={NS}&state=pending")
        expect(page.locator("#timers tr[data-id]")).to_have_count(50)
        page.click("#next")
        expect(page.locator("body")).to_have_attribute("data-loaded", "timers")
        expect(page.locator("#timers tr[data-id]")).to_have_count(20)
        expect(page.locator("#timers tr[data-id]").first).to_have_attribute("data-id", "later-050")
        self.shot(page, "timers")
        page = self.open(f"timer?ns={NS}-dead&id=lost-0")
        expect(page.locator("#detail")).to_contain_text("DEAD")
        expect(page.locator("#payload")).to_contain_text('"order": 0')
        expect(page.locator("#attempts")).to_contain_text("push")
        self.shot(page, "timer")

    def test_4_dead_letters_redrive_from_the_ui(self):
        page = self.open(f"dead?ns={NS}-dead")
        rows = page.locator("#dead tr[data-id]")
        expect(rows).to_have_count(3)
        self.shot(page, "dead-letters")
        page.click("#dead tr[data-id='lost-1'] button.redrive")
        expect(page.locator("#redriven")).to_have_text("redriven: 1")
        t = ok("GET", f"/v1/namespaces/{NS}-dead/timers/lost-1")["timer"]
        self.assertEqual(t["redrives"], 1, "the server redrove it")
        other = ok("GET", f"/v1/namespaces/{NS}-dead/timers/lost-2")["timer"]
        self.assertEqual(other["redrives"], 0, "and only it")

    def test_5_charts(self):
        page = self.open("charts")
        expect(page.locator("#latest")).to_contain_text("timers/s", timeout=10_000)
        # At least one interval with fires shows a rate.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            text = page.locator("#latest").inner_text()
            fired = int(text.split("; ")[1].split(" ")[0])
            if fired > 0 and not text.startswith("now: 0.0"):
                break
            page.wait_for_timeout(500)
        self.assertGreater(fired, 0, text)
        page.wait_for_timeout(4000)  # a few seconds of lines in the screenshot
        self.shot(page, "charts")

    def test_6_read_only_unless_permitted(self):
        admin = ok("POST", "/v1/access/keys", {"name": "console-admin", "roles": ["admin"]})["token"]
        reader = ok("POST", "/v1/access/keys", {"name": "console-reader", "roles": ["read:*"]}, admin)["token"]
        ok("PUT", "/v1/access/auth", {"enabled": True}, admin)
        try:
            wait(lambda: call("GET", "/v1/cluster/status")[0] == 401, "auth on")
            # Without a key: the console says so and shows no data.
            page = self.open("cluster")
            expect(page.locator("#error")).to_contain_text("UNAUTHENTICATED")
            expect(page.locator("#who")).to_contain_text("give an API key")
            # A read-only key: the dead letters show, the redrive buttons are disabled...
            page = self.open(f"dead?ns={NS}-dead", token=reader)
            expect(page.locator("#who")).to_contain_text("read:*")
            self.assertGreater(page.locator("#dead tr[data-id]").count(), 0)
            for b in page.locator("button.redrive").all():
                expect(b).to_be_disabled()
            self.shot(page, "dead-letters-read-only")
            # ...and the server would refuse the call anyway.
            status, v = call("POST", f"/v1/namespaces/{NS}-dead/timers/lost-0:redrive", {}, reader)
            self.assertEqual(status, 403, v)
            # The admin key may.
            page = self.open(f"dead?ns={NS}-dead", token=admin)
            expect(page.locator("#dead tr[data-id='lost-0'] button.redrive")).to_be_enabled()
        finally:
            ok("PUT", "/v1/access/auth", {"enabled": False}, admin)


if __name__ == "__main__":
    unittest.main()
