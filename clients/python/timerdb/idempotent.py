"""Which calls may be sent twice: the rule the server's forwarder and the Rust client follow too
(timerdb-client's `idempotent` module; DESIGN invariant 9).

A call whose outcome is unknown may have happened. Sending it again is safe only if applying it
twice is the same as applying it once, answer included: a refusal means nothing happened. Safe:
reads, create-only Schedule and ScheduleBatch (a repeat finds the timer, `created = false`), an
upsert of a recurring timer, an unconditional Cancel, acks, pausing, namespace policies,
AddNode, RevokeKey, TransferLeader to a named node, Redrive of a whole namespace. Not safe:
conditions (`if_state`, `if_revision`), Reschedule, a one-shot Schedule in another mode, Nack, a
one-timer Redrive, CreateKey, RemoveNode, TransferLeader to "any". `clients/idempotence.json`
holds the cases both libraries are tested against.
"""

from timerdb.v1 import timerdb_pb2 as pb

_ALWAYS = {
    "Timers/ScheduleBatch", "Timers/Get", "Timers/List", "Timers/Ack", "Timers/AckBatch",
    "Timers/Pause", "Timers/Resume", "Namespaces/PutNamespace", "Namespaces/GetNamespace",
    "Namespaces/ListNamespaces", "Namespaces/PauseNamespace", "Namespaces/ResumeNamespace",
    "Cluster/Status", "Cluster/Digest", "Cluster/Overview", "Cluster/Backup", "Cluster/AddNode",
    "Access/RevokeKey", "Access/ListKeys", "Access/SetAuth", "Access/WhoAmI",
}


def schedule(r: pb.ScheduleRequest) -> bool:
    conditional = r.if_state != 0 or r.if_revision != 0
    creates = r.mode in (pb.CREATE_MODE_UNSPECIFIED, pb.CREATE_MODE_CREATE_ONLY)
    series_upsert = r.HasField("recurrence") and r.mode == pb.CREATE_MODE_UPSERT
    return not conditional and (creates or series_upsert)


def cancel(r: pb.CancelRequest) -> bool:
    return r.if_state == 0 and r.if_revision == 0


def redrive(r: pb.RedriveRequest) -> bool:
    return r.all


def transfer_leader(r: pb.TransferLeaderRequest) -> bool:
    return r.node_id != 0


_BY_REQUEST = {
    "Timers/Schedule": schedule,
    "Timers/Cancel": cancel,
    "Timers/Redrive": redrive,
    "Cluster/TransferLeader": transfer_leader,
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
