"""Hash slots: the unit a sharded cluster places timers by (docs/sharding.md section 1), the
rule the server and the Rust client (timerdb-client's `hash_slot` module) follow too.

A timer's hash slot is `crc32(namespace + b"\\0" + routing key) mod 1024`, CRC-32 as zlib
computes it. The routing key of an id: the text between its first `{` and the next `}`, if not
empty (a hash tag); else the id without every trailing occurrence suffix
`@YYYY-MM-DDTHH:MM:SS.mmmZ` that follows a non-empty series id (the shape is checked, not the
date); else the id. A pinned namespace (the default) hashes an empty routing key, so all its
timers share one hash slot. `clients/hash_slots.json` holds the cases every implementation is
tested against.
"""

import zlib

HASH_SLOTS = 1024

_SHAPE = "@dddd-dd-ddTdd:dd:dd.dddZ"


def _hash_tag(id: str):
    open_ = id.find("{")
    if open_ < 0:
        return None
    close = id.find("}", open_ + 1)
    if close < 0 or close == open_ + 1:
        return None
    return id[open_ + 1:close]


def _without_occurrence_suffix(id: str):
    raw = id.encode()
    start = len(raw) - len(_SHAPE)
    if start <= 0:
        return None
    for b, s in zip(raw[start:], _SHAPE.encode()):
        if s == ord("d"):
            if not (ord("0") <= b <= ord("9")):
                return None
        elif b != s:
            return None
    return raw[:start].decode()


def routing_key(id: str) -> str:
    """The part of `id` a spread namespace hashes."""
    tag = _hash_tag(id)
    if tag is not None:
        return tag
    key = id
    while True:
        series = _without_occurrence_suffix(key)
        if series is None:
            return key
        key = series


def hash_slot(namespace: str, id: str, placement: str = "pinned") -> int:
    """The hash slot (0..1023) of timer `id` in `namespace`, placed `pinned` or `spread`."""
    if placement not in ("pinned", "spread"):
        raise ValueError(f"placement must be 'pinned' or 'spread', not {placement!r}")
    key = routing_key(id) if placement == "spread" else ""
    return zlib.crc32(namespace.encode() + b"\0" + key.encode()) % HASH_SLOTS
