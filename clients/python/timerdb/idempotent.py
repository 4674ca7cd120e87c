"""Which calls may be sent twice: the rule the server's forwarder and the Rust client follow too
(timerdb-client's `idempotent` module; DESIGN invariant 9).

A call whose outcome is unknown may have happened. Sending it again is safe only if applying it
twice is the same as applying it once, answer included (a refusal means nothing happened), and
no other client's call landing in between can be undone by the repeat. Safe: reads, create-only
Schedule and ScheduleBatch (a repeat finds the timer, `created = false`), an unconditional
Cancel, acks, RevokeKey. Not safe: conditions (`if_state`, `if_revision`), Reschedule, a
Schedule in another mode (a recurring timer's upsert too), pausing and resuming, namespace
policies, SetAuth, AddNode, TransferLeader, Redrive, Nack, CreateKey, RemoveNode.
`clients/idempotence.json` holds the cases both libraries are tested against.
"""

from timerdb.v1 import timerdb_pb2 as pb

_ALWAYS = {
    "Timers/ScheduleBatch", "Timers/Get", "Timers/List", "Timers/Ack", "Timers/AckBatch",
    "Namespaces/GetNamespace", "Namespaces/ListNamespaces",
    "Cluster/Status", "Cluster/Digest", "Cluster/Overview", "Cluster/Backup",
    "Access/RevokeKey", "Access/ListKeys", "Access/WhoAmI",
}


def schedule(r: pb.ScheduleRequest) -> bool:
    conditional = r.if_state != 0 or r.if_revision != 0
    creates = r.mode in (pb.CREATE_MODE_UNSPECIFIED, pb.CREATE_MODE_CREATE_ONLY)
    return not conditional and creates


def cancel(r: pb.CancelRequest) -> bool:
    return r.if_state == 0 and r.if_revision == 0


_BY_REQUEST = {
    "Timers/Schedule": schedule,
    "Timers/Cancel": cancel,
}


def retry_safe(method: str, request) -> bool:
    """Whether `request` sent to `method` (`/timerdb.v1.Service/Method`) twice is the same as once."""
    prefix = "/timerdb.v1."
    if not method.startswith(prefix):
        return False
    name = method[len(prefix):]
    if name in _ALWAYS:
        return True
    judge = _BY_REQUEST.get(name)
    return judge is not None and judge(request)
