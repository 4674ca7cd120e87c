# A push receiver in Python (standard library only): checks the Standard Webhooks signature,
# prints the timer, answers 204 (ACKED). Usage: python3 push_receiver.py whsec_... [port]
import base64, hashlib, hmac, http.server, sys, time
KEY = base64.b64decode(sys.argv[1].removeprefix("whsec_"))
class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        msg_id, ts = self.headers["webhook-id"], self.headers["webhook-timestamp"]
        mac = hmac.new(KEY, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
        want = "v1," + base64.b64encode(mac).decode()
        ok = any(hmac.compare_digest(s, want) for s in self.headers["webhook-signature"].split())
        if ok and abs(time.time() - int(ts)) <= 300:   # dedupe by msg_id: stable across retries
            print(self.headers["timerdb-namespace"], self.headers["timerdb-id"], msg_id, body, flush=True)
        self.send_response(204 if ok else 401); self.end_headers()
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2]) if len(sys.argv) > 2 else 8080), Receiver).serve_forever()
