#!/usr/bin/env python3
"""The consumer a new user writes with raw grpcio (issue 34's target): Subscribe, then a unary
Ack for each delivery before reading the next; N such consumers (threads, each its own
channel) share one namespace while R timers fall due per second for S seconds.

Timers are scheduled ahead (ScheduleBatch, 1/10 s of them at a time, `--lead` before they are
due) by a producer thread. Prints the rate the consumers kept and how late each timer was first
received (receipt time minus fire time; the cluster's nodes and this script share the clock).

    ~/.cache/timerdb-pyvenv/bin/python bench/naive_grpcio.py --connect ADDR,ADDR,ADDR
    (the venv clients/python/test.sh makes, with grpcio)
"""
import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "clients", "python"))
import grpc  # noqa: E402
from timerdb.v1 import timerdb_pb2 as pb  # noqa: E402
from timerdb.v1 import timerdb_pb2_grpc as rpc  # noqa: E402


def leader(addrs):
    for a in addrs:
        try:
            s = rpc.ClusterStub(grpc.insecure_channel(a)).Status(pb.StatusRequest(), timeout=1)
            if s.role == "leader":
                return a
        except grpc.RpcError:
            continue
    return addrs[0]


def produce(stub, ns, rate, seconds, lead_ms, done):
    start = int(time.time() * 1000) + lead_ms
    per_tick = max(1, rate // 10)
    n = 0
    for tick in range(seconds * 10):
        due0 = start + tick * 100
        reqs = []
        for i in range(per_tick):
            reqs.append(pb.ScheduleRequest(namespace=ns, id=f"t{n}", fire_at_ms=due0 + i * 100 // per_tick,
                                           payload=b"x" * 32))
            n += 1
        stub.ScheduleBatch(pb.ScheduleBatchRequest(timers=reqs), timeout=10)
        # Stay about `lead` ahead of the fire times.
        ahead = due0 - lead_ms - int(time.time() * 1000)
        if ahead > 0:
            time.sleep(ahead / 1000)
    done["total"] = n


def consume(addr, ns, seen, lock, stop):
    ch = grpc.insecure_channel(addr)
    stub = rpc.TimersStub(ch)
    while not stop.is_set():
        try:
            for d in stub.Subscribe(pb.SubscribeRequest(namespace=ns, consumer="naive-grpcio")):
                recv = time.time() * 1000
                stub.Ack(pb.AckRequest(namespace=ns, id=d.timer.id, attempt=d.attempt), timeout=10)
                ACK_MS.append(time.time() * 1000 - recv)
                with lock:
                    seen.setdefault(d.timer.id, (d.timer.fire_at_ms, recv, time.time() * 1000))
                if stop.is_set():
                    return
        except grpc.RpcError:
            time.sleep(0.05)


ACK_MS = []


def pct(xs, p):
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--connect", required=True)
    ap.add_argument("--rate", type=int, default=500)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--lead-ms", type=int, default=2000)
    a = ap.parse_args()
    addrs = a.connect.split(",")
    addr = leader(addrs)
    ns = f"naive-grpcio-{int(time.time() * 1000)}"
    seen, lock, stop, done = {}, threading.Lock(), threading.Event(), {}
    consumers = [threading.Thread(target=consume, args=(addr, ns, seen, lock, stop), daemon=True)
                 for _ in range(a.consumers)]
    for t in consumers:
        t.start()
    time.sleep(0.3)
    produce(rpc.TimersStub(grpc.insecure_channel(addr)), ns, a.rate, a.seconds, a.lead_ms, done)
    total = done["total"]
    deadline = time.time() + a.seconds * 4 + 30
    while time.time() < deadline:
        with lock:
            if len(seen) >= total:
                break
        time.sleep(0.1)
    stop.set()
    with lock:
        got = list(seen.values())
    late = sorted(recv - due for due, recv, _ in got)
    span = (max(ack for _, _, ack in got) - min(due for due, _, _ in got)) / 1000 if got else 1
    print(f"naive-grpcio {a.consumers} consumers, {a.rate}/s for {a.seconds}s: "
          f"received+acked rate {len(got) / span:.0f} timers/s; first receipt p50 {pct(late, 50):.1f} ms, "
          f"p99 {pct(late, 99):.1f} ms, max {late[-1] if late else float('nan'):.1f} ms; "
          f"early {sum(1 for x in late if x < 0)}; not received {total - len(got)}; "
          f"unary Ack call p50 {pct(sorted(ACK_MS), 50):.2f} ms, p99 {pct(sorted(ACK_MS), 99):.2f} ms")


if __name__ == "__main__":
    main()
