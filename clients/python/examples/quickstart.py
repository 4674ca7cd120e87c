import os

from timerdb import Client

addrs = os.environ.get("TIMERDB_ADDRS", "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103")
# Any nodes: the client finds the leader, and retries what is safe to retry.
with Client(addrs.split(",")) as client:
    tid = f"invoice-{os.getpid()}"
    r = client.schedule("billing", tid, delay_ms=1000, json_payload={"customer": 7})
    print(f"scheduled {tid} (created: {r.created})")
    # A consumer: resubscribes through another node if one fails, acks in batches.
    with client.consumer("billing") as consumer:
        for delivery in consumer:
            print(f"fired: {delivery.timer.id} (attempt {delivery.attempt})")
            consumer.ack(delivery)
            if delivery.timer.id == tid:
                break
        consumer.flush()
        print(f"acked: {consumer.acked}")
