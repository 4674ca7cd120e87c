from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TimerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIMER_STATE_UNSPECIFIED: _ClassVar[TimerState]
    TIMER_STATE_PENDING: _ClassVar[TimerState]
    TIMER_STATE_FIRED: _ClassVar[TimerState]
    TIMER_STATE_ACKED: _ClassVar[TimerState]
    TIMER_STATE_CANCELLED: _ClassVar[TimerState]
    TIMER_STATE_DEAD: _ClassVar[TimerState]
    TIMER_STATE_EXPIRED: _ClassVar[TimerState]

class Misfire(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MISFIRE_UNSPECIFIED: _ClassVar[Misfire]
    MISFIRE_FIRE_ONCE: _ClassVar[Misfire]
    MISFIRE_FIRE_ALL: _ClassVar[Misfire]
    MISFIRE_SKIP: _ClassVar[Misfire]

class Overlap(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OVERLAP_UNSPECIFIED: _ClassVar[Overlap]
    OVERLAP_ALLOW: _ClassVar[Overlap]
    OVERLAP_SKIP: _ClassVar[Overlap]
    OVERLAP_BUFFER_ONE: _ClassVar[Overlap]

class DeliveryPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELIVERY_PHASE_UNSPECIFIED: _ClassVar[DeliveryPhase]
    DELIVERY_PHASE_READY: _ClassVar[DeliveryPhase]
    DELIVERY_PHASE_IN_FLIGHT: _ClassVar[DeliveryPhase]
    DELIVERY_PHASE_BACKOFF: _ClassVar[DeliveryPhase]

class CreateMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CREATE_MODE_UNSPECIFIED: _ClassVar[CreateMode]
    CREATE_MODE_CREATE_ONLY: _ClassVar[CreateMode]
    CREATE_MODE_UPSERT: _ClassVar[CreateMode]
    CREATE_MODE_DEBOUNCE: _ClassVar[CreateMode]
    CREATE_MODE_KEEP_EARLIEST: _ClassVar[CreateMode]
    CREATE_MODE_KEEP_LATEST: _ClassVar[CreateMode]

class MisfireAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MISFIRE_ACTION_UNSPECIFIED: _ClassVar[MisfireAction]
    MISFIRE_ACTION_FIRE: _ClassVar[MisfireAction]
    MISFIRE_ACTION_DEAD: _ClassVar[MisfireAction]
    MISFIRE_ACTION_SKIP: _ClassVar[MisfireAction]
TIMER_STATE_UNSPECIFIED: TimerState
TIMER_STATE_PENDING: TimerState
TIMER_STATE_FIRED: TimerState
TIMER_STATE_ACKED: TimerState
TIMER_STATE_CANCELLED: TimerState
TIMER_STATE_DEAD: TimerState
TIMER_STATE_EXPIRED: TimerState
MISFIRE_UNSPECIFIED: Misfire
MISFIRE_FIRE_ONCE: Misfire
MISFIRE_FIRE_ALL: Misfire
MISFIRE_SKIP: Misfire
OVERLAP_UNSPECIFIED: Overlap
OVERLAP_ALLOW: Overlap
OVERLAP_SKIP: Overlap
OVERLAP_BUFFER_ONE: Overlap
DELIVERY_PHASE_UNSPECIFIED: DeliveryPhase
DELIVERY_PHASE_READY: DeliveryPhase
DELIVERY_PHASE_IN_FLIGHT: DeliveryPhase
DELIVERY_PHASE_BACKOFF: DeliveryPhase
CREATE_MODE_UNSPECIFIED: CreateMode
CREATE_MODE_CREATE_ONLY: CreateMode
CREATE_MODE_UPSERT: CreateMode
CREATE_MODE_DEBOUNCE: CreateMode
CREATE_MODE_KEEP_EARLIEST: CreateMode
CREATE_MODE_KEEP_LATEST: CreateMode
MISFIRE_ACTION_UNSPECIFIED: MisfireAction
MISFIRE_ACTION_FIRE: MisfireAction
MISFIRE_ACTION_DEAD: MisfireAction
MISFIRE_ACTION_SKIP: MisfireAction

class ReceiveResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Timer(_message.Message):
    __slots__ = ("namespace", "id", "fire_at_ms", "payload", "state", "attempts", "created_at_ms", "fired_at_ms", "fire_index", "finished_at_ms", "phase", "wake_at_ms", "last_delivered_at_ms", "timeouts", "nacks", "redrives", "content_type", "attempt_log", "series", "revision")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    FIRE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FIRED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FIRE_INDEX_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    WAKE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_DELIVERED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUTS_FIELD_NUMBER: _ClassVar[int]
    NACKS_FIELD_NUMBER: _ClassVar[int]
    REDRIVES_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_LOG_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    fire_at_ms: int
    payload: bytes
    state: TimerState
    attempts: int
    created_at_ms: int
    fired_at_ms: int
    fire_index: int
    finished_at_ms: int
    phase: DeliveryPhase
    wake_at_ms: int
    last_delivered_at_ms: int
    timeouts: int
    nacks: int
    redrives: int
    content_type: str
    attempt_log: _containers.RepeatedCompositeFieldContainer[Attempt]
    series: Series
    revision: int
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., fire_at_ms: _Optional[int] = ..., payload: _Optional[bytes] = ..., state: _Optional[_Union[TimerState, str]] = ..., attempts: _Optional[int] = ..., created_at_ms: _Optional[int] = ..., fired_at_ms: _Optional[int] = ..., fire_index: _Optional[int] = ..., finished_at_ms: _Optional[int] = ..., phase: _Optional[_Union[DeliveryPhase, str]] = ..., wake_at_ms: _Optional[int] = ..., last_delivered_at_ms: _Optional[int] = ..., timeouts: _Optional[int] = ..., nacks: _Optional[int] = ..., redrives: _Optional[int] = ..., content_type: _Optional[str] = ..., attempt_log: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ..., series: _Optional[_Union[Series, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class Recurrence(_message.Message):
    __slots__ = ("cron", "time_zone", "every_ms", "anchor_ms", "start_ms", "end_ms", "max_count", "misfire", "catch_up_window_ms", "max_lateness_ms", "overlap", "jitter_ms")
    CRON_FIELD_NUMBER: _ClassVar[int]
    TIME_ZONE_FIELD_NUMBER: _ClassVar[int]
    EVERY_MS_FIELD_NUMBER: _ClassVar[int]
    ANCHOR_MS_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_COUNT_FIELD_NUMBER: _ClassVar[int]
    MISFIRE_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_LATENESS_MS_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_FIELD_NUMBER: _ClassVar[int]
    JITTER_MS_FIELD_NUMBER: _ClassVar[int]
    cron: str
    time_zone: str
    every_ms: int
    anchor_ms: int
    start_ms: int
    end_ms: int
    max_count: int
    misfire: Misfire
    catch_up_window_ms: int
    max_lateness_ms: int
    overlap: Overlap
    jitter_ms: int
    def __init__(self, cron: _Optional[str] = ..., time_zone: _Optional[str] = ..., every_ms: _Optional[int] = ..., anchor_ms: _Optional[int] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., max_count: _Optional[int] = ..., misfire: _Optional[_Union[Misfire, str]] = ..., catch_up_window_ms: _Optional[int] = ..., max_lateness_ms: _Optional[int] = ..., overlap: _Optional[_Union[Overlap, str]] = ..., jitter_ms: _Optional[int] = ...) -> None: ...

class Series(_message.Message):
    __slots__ = ("recurrence", "status", "next_ms", "next_id", "fired", "skipped", "missed", "recent", "tzdb")
    RECURRENCE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NEXT_MS_FIELD_NUMBER: _ClassVar[int]
    NEXT_ID_FIELD_NUMBER: _ClassVar[int]
    FIRED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    MISSED_FIELD_NUMBER: _ClassVar[int]
    RECENT_FIELD_NUMBER: _ClassVar[int]
    TZDB_FIELD_NUMBER: _ClassVar[int]
    recurrence: Recurrence
    status: str
    next_ms: _containers.RepeatedScalarFieldContainer[int]
    next_id: str
    fired: int
    skipped: int
    missed: int
    recent: _containers.RepeatedCompositeFieldContainer[Occurrence]
    tzdb: str
    def __init__(self, recurrence: _Optional[_Union[Recurrence, _Mapping]] = ..., status: _Optional[str] = ..., next_ms: _Optional[_Iterable[int]] = ..., next_id: _Optional[str] = ..., fired: _Optional[int] = ..., skipped: _Optional[int] = ..., missed: _Optional[int] = ..., recent: _Optional[_Iterable[_Union[Occurrence, _Mapping]]] = ..., tzdb: _Optional[str] = ...) -> None: ...

class Occurrence(_message.Message):
    __slots__ = ("id", "fate", "state")
    ID_FIELD_NUMBER: _ClassVar[int]
    FATE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    id: str
    fate: str
    state: TimerState
    def __init__(self, id: _Optional[str] = ..., fate: _Optional[str] = ..., state: _Optional[_Union[TimerState, str]] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("at_ms", "attempt", "channel", "outcome", "http_status", "grpc_code", "latency_ms", "detail")
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    GRPC_CODE_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    at_ms: int
    attempt: int
    channel: str
    outcome: str
    http_status: int
    grpc_code: int
    latency_ms: int
    detail: str
    def __init__(self, at_ms: _Optional[int] = ..., attempt: _Optional[int] = ..., channel: _Optional[str] = ..., outcome: _Optional[str] = ..., http_status: _Optional[int] = ..., grpc_code: _Optional[int] = ..., latency_ms: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class ScheduleRequest(_message.Message):
    __slots__ = ("namespace", "id", "fire_at_ms", "delay_ms", "payload", "content_type", "recurrence", "mode", "max_wait_ms", "if_state", "if_revision", "max_lateness_ms", "misfire")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    FIRE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    RECURRENCE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    IF_STATE_FIELD_NUMBER: _ClassVar[int]
    IF_REVISION_FIELD_NUMBER: _ClassVar[int]
    MAX_LATENESS_MS_FIELD_NUMBER: _ClassVar[int]
    MISFIRE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    fire_at_ms: int
    delay_ms: int
    payload: bytes
    content_type: str
    recurrence: Recurrence
    mode: CreateMode
    max_wait_ms: int
    if_state: TimerState
    if_revision: int
    max_lateness_ms: int
    misfire: MisfireAction
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., fire_at_ms: _Optional[int] = ..., delay_ms: _Optional[int] = ..., payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., recurrence: _Optional[_Union[Recurrence, _Mapping]] = ..., mode: _Optional[_Union[CreateMode, str]] = ..., max_wait_ms: _Optional[int] = ..., if_state: _Optional[_Union[TimerState, str]] = ..., if_revision: _Optional[int] = ..., max_lateness_ms: _Optional[int] = ..., misfire: _Optional[_Union[MisfireAction, str]] = ...) -> None: ...

class ScheduleResponse(_message.Message):
    __slots__ = ("timer", "created")
    TIMER_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    timer: Timer
    created: bool
    def __init__(self, timer: _Optional[_Union[Timer, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class ScheduleBatchRequest(_message.Message):
    __slots__ = ("timers",)
    TIMERS_FIELD_NUMBER: _ClassVar[int]
    timers: _containers.RepeatedCompositeFieldContainer[ScheduleRequest]
    def __init__(self, timers: _Optional[_Iterable[_Union[ScheduleRequest, _Mapping]]] = ...) -> None: ...

class ScheduleBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ScheduleResponse]
    def __init__(self, results: _Optional[_Iterable[_Union[ScheduleResponse, _Mapping]]] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("namespace", "id", "if_state", "if_revision")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    IF_STATE_FIELD_NUMBER: _ClassVar[int]
    IF_REVISION_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    if_state: TimerState
    if_revision: int
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., if_state: _Optional[_Union[TimerState, str]] = ..., if_revision: _Optional[int] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("timer",)
    TIMER_FIELD_NUMBER: _ClassVar[int]
    timer: Timer
    def __init__(self, timer: _Optional[_Union[Timer, _Mapping]] = ...) -> None: ...

class RescheduleRequest(_message.Message):
    __slots__ = ("namespace", "id", "fire_at_ms", "delay_ms", "extend_by_ms", "pull_in_ms", "if_state", "if_revision")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    FIRE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    EXTEND_BY_MS_FIELD_NUMBER: _ClassVar[int]
    PULL_IN_MS_FIELD_NUMBER: _ClassVar[int]
    IF_STATE_FIELD_NUMBER: _ClassVar[int]
    IF_REVISION_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    fire_at_ms: int
    delay_ms: int
    extend_by_ms: int
    pull_in_ms: int
    if_state: TimerState
    if_revision: int
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., fire_at_ms: _Optional[int] = ..., delay_ms: _Optional[int] = ..., extend_by_ms: _Optional[int] = ..., pull_in_ms: _Optional[int] = ..., if_state: _Optional[_Union[TimerState, str]] = ..., if_revision: _Optional[int] = ...) -> None: ...

class RescheduleResponse(_message.Message):
    __slots__ = ("timer",)
    TIMER_FIELD_NUMBER: _ClassVar[int]
    timer: Timer
    def __init__(self, timer: _Optional[_Union[Timer, _Mapping]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("namespace", "id", "next_count")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_COUNT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    next_count: int
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., next_count: _Optional[int] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("timer",)
    TIMER_FIELD_NUMBER: _ClassVar[int]
    timer: Timer
    def __init__(self, timer: _Optional[_Union[Timer, _Mapping]] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("namespace", "state", "fire_from_ms", "fire_to_ms", "limit", "page_token", "recurring")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FIRE_FROM_MS_FIELD_NUMBER: _ClassVar[int]
    FIRE_TO_MS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RECURRING_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    state: TimerState
    fire_from_ms: int
    fire_to_ms: int
    limit: int
    page_token: str
    recurring: bool
    def __init__(self, namespace: _Optional[str] = ..., state: _Optional[_Union[TimerState, str]] = ..., fire_from_ms: _Optional[int] = ..., fire_to_ms: _Optional[int] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ..., recurring: _Optional[bool] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("timers", "next_page_token")
    TIMERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    timers: _containers.RepeatedCompositeFieldContainer[Timer]
    next_page_token: str
    def __init__(self, timers: _Optional[_Iterable[_Union[Timer, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("namespace", "consumer", "max_in_flight")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    consumer: str
    max_in_flight: int
    def __init__(self, namespace: _Optional[str] = ..., consumer: _Optional[str] = ..., max_in_flight: _Optional[int] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("timer", "attempt")
    TIMER_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    timer: Timer
    attempt: int
    def __init__(self, timer: _Optional[_Union[Timer, _Mapping]] = ..., attempt: _Optional[int] = ...) -> None: ...

class ConsumeRequest(_message.Message):
    __slots__ = ("subscribe", "acks")
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    subscribe: SubscribeRequest
    acks: _containers.RepeatedCompositeFieldContainer[DeliveryAck]
    def __init__(self, subscribe: _Optional[_Union[SubscribeRequest, _Mapping]] = ..., acks: _Optional[_Iterable[_Union[DeliveryAck, _Mapping]]] = ...) -> None: ...

class DeliveryAck(_message.Message):
    __slots__ = ("id", "attempt", "nack")
    ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    NACK_FIELD_NUMBER: _ClassVar[int]
    id: str
    attempt: int
    nack: bool
    def __init__(self, id: _Optional[str] = ..., attempt: _Optional[int] = ..., nack: _Optional[bool] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("namespace", "id", "attempt", "wait_for_commit")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOR_COMMIT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    attempt: int
    wait_for_commit: bool
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., attempt: _Optional[int] = ..., wait_for_commit: _Optional[bool] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("timer", "committed")
    TIMER_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    timer: Timer
    committed: bool
    def __init__(self, timer: _Optional[_Union[Timer, _Mapping]] = ..., committed: _Optional[bool] = ...) -> None: ...

class AckBatchRequest(_message.Message):
    __slots__ = ("acks",)
    ACKS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[AckRequest]
    def __init__(self, acks: _Optional[_Iterable[_Union[AckRequest, _Mapping]]] = ...) -> None: ...

class AckBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AckResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AckResult, _Mapping]]] = ...) -> None: ...

class AckResult(_message.Message):
    __slots__ = ("timer", "code", "message")
    TIMER_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    timer: Timer
    code: int
    message: str
    def __init__(self, timer: _Optional[_Union[Timer, _Mapping]] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class NackRequest(_message.Message):
    __slots__ = ("namespace", "id", "attempt")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    attempt: int
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class NackResponse(_message.Message):
    __slots__ = ("timer",)
    TIMER_FIELD_NUMBER: _ClassVar[int]
    timer: Timer
    def __init__(self, timer: _Optional[_Union[Timer, _Mapping]] = ...) -> None: ...

class PauseRequest(_message.Message):
    __slots__ = ("namespace", "id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class PauseResponse(_message.Message):
    __slots__ = ("timer",)
    TIMER_FIELD_NUMBER: _ClassVar[int]
    timer: Timer
    def __init__(self, timer: _Optional[_Union[Timer, _Mapping]] = ...) -> None: ...

class RedriveRequest(_message.Message):
    __slots__ = ("namespace", "id", "all")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    id: str
    all: bool
    def __init__(self, namespace: _Optional[str] = ..., id: _Optional[str] = ..., all: _Optional[bool] = ...) -> None: ...

class RedriveResponse(_message.Message):
    __slots__ = ("timers", "redriven")
    TIMERS_FIELD_NUMBER: _ClassVar[int]
    REDRIVEN_FIELD_NUMBER: _ClassVar[int]
    timers: _containers.RepeatedCompositeFieldContainer[Timer]
    redriven: int
    def __init__(self, timers: _Optional[_Iterable[_Union[Timer, _Mapping]]] = ..., redriven: _Optional[int] = ...) -> None: ...

class SlotsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SlotsResponse(_message.Message):
    __slots__ = ("node_id", "epoch", "hash_slots", "groups")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HASH_SLOTS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    epoch: int
    hash_slots: int
    groups: _containers.RepeatedCompositeFieldContainer[GroupInfo]
    def __init__(self, node_id: _Optional[int] = ..., epoch: _Optional[int] = ..., hash_slots: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[GroupInfo, _Mapping]]] = ...) -> None: ...

class GroupInfo(_message.Message):
    __slots__ = ("group", "hash_slots", "leader_id", "leader_addr", "term", "members", "role", "last_log_index", "applied_index", "pending_timers")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    HASH_SLOTS_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDR_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    PENDING_TIMERS_FIELD_NUMBER: _ClassVar[int]
    group: int
    hash_slots: _containers.RepeatedCompositeFieldContainer[HashSlotRange]
    leader_id: int
    leader_addr: str
    term: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    role: str
    last_log_index: int
    applied_index: int
    pending_timers: int
    def __init__(self, group: _Optional[int] = ..., hash_slots: _Optional[_Iterable[_Union[HashSlotRange, _Mapping]]] = ..., leader_id: _Optional[int] = ..., leader_addr: _Optional[str] = ..., term: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., role: _Optional[str] = ..., last_log_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., pending_timers: _Optional[int] = ...) -> None: ...

class HashSlotRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("node_id", "role", "leader_id", "term", "last_log_index", "applied_index", "members", "pending_timers", "time_cursor_ms", "commit_index", "snapshot_index", "purged_index", "snapshots_built", "snapshots_installed", "state_machine_keys_written", "timers_acked", "timers_fired", "fire_lateness_sum_ms", "fire_lateness_le", "calls_forwarded")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    PENDING_TIMERS_FIELD_NUMBER: _ClassVar[int]
    TIME_CURSOR_MS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    PURGED_INDEX_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_BUILT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_INSTALLED_FIELD_NUMBER: _ClassVar[int]
    STATE_MACHINE_KEYS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    TIMERS_ACKED_FIELD_NUMBER: _ClassVar[int]
    TIMERS_FIRED_FIELD_NUMBER: _ClassVar[int]
    FIRE_LATENESS_SUM_MS_FIELD_NUMBER: _ClassVar[int]
    FIRE_LATENESS_LE_FIELD_NUMBER: _ClassVar[int]
    CALLS_FORWARDED_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    role: str
    leader_id: int
    term: int
    last_log_index: int
    applied_index: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    pending_timers: int
    time_cursor_ms: int
    commit_index: int
    snapshot_index: int
    purged_index: int
    snapshots_built: int
    snapshots_installed: int
    state_machine_keys_written: int
    timers_acked: int
    timers_fired: int
    fire_lateness_sum_ms: int
    fire_lateness_le: _containers.RepeatedScalarFieldContainer[int]
    calls_forwarded: int
    def __init__(self, node_id: _Optional[int] = ..., role: _Optional[str] = ..., leader_id: _Optional[int] = ..., term: _Optional[int] = ..., last_log_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., pending_timers: _Optional[int] = ..., time_cursor_ms: _Optional[int] = ..., commit_index: _Optional[int] = ..., snapshot_index: _Optional[int] = ..., purged_index: _Optional[int] = ..., snapshots_built: _Optional[int] = ..., snapshots_installed: _Optional[int] = ..., state_machine_keys_written: _Optional[int] = ..., timers_acked: _Optional[int] = ..., timers_fired: _Optional[int] = ..., fire_lateness_sum_ms: _Optional[int] = ..., fire_lateness_le: _Optional[_Iterable[int]] = ..., calls_forwarded: _Optional[int] = ...) -> None: ...

class DigestRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DigestResponse(_message.Message):
    __slots__ = ("node_id", "applied_index", "digest")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    applied_index: int
    digest: int
    def __init__(self, node_id: _Optional[int] = ..., applied_index: _Optional[int] = ..., digest: _Optional[int] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("node_id", "addr", "voter")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    VOTER_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    addr: str
    voter: bool
    def __init__(self, node_id: _Optional[int] = ..., addr: _Optional[str] = ..., voter: _Optional[bool] = ...) -> None: ...

class AddNodeRequest(_message.Message):
    __slots__ = ("node_id", "addr", "learner")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    addr: str
    learner: bool
    def __init__(self, node_id: _Optional[int] = ..., addr: _Optional[str] = ..., learner: _Optional[bool] = ...) -> None: ...

class AddNodeResponse(_message.Message):
    __slots__ = ("members",)
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class RemoveNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    def __init__(self, node_id: _Optional[int] = ...) -> None: ...

class RemoveNodeResponse(_message.Message):
    __slots__ = ("members",)
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class TransferLeaderRequest(_message.Message):
    __slots__ = ("node_id", "group")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    group: int
    def __init__(self, node_id: _Optional[int] = ..., group: _Optional[int] = ...) -> None: ...

class TransferLeaderResponse(_message.Message):
    __slots__ = ("leader_id", "group")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    leader_id: int
    group: int
    def __init__(self, leader_id: _Optional[int] = ..., group: _Optional[int] = ...) -> None: ...

class OverviewRequest(_message.Message):
    __slots__ = ("by_state",)
    BY_STATE_FIELD_NUMBER: _ClassVar[int]
    by_state: bool
    def __init__(self, by_state: _Optional[bool] = ...) -> None: ...

class OverviewResponse(_message.Message):
    __slots__ = ("leader_id", "term", "last_log_index", "commit_index", "applied_index", "members", "namespaces")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    leader_id: int
    term: int
    last_log_index: int
    commit_index: int
    applied_index: int
    members: _containers.RepeatedCompositeFieldContainer[MemberProgress]
    namespaces: _containers.RepeatedCompositeFieldContainer[NamespaceCounts]
    def __init__(self, leader_id: _Optional[int] = ..., term: _Optional[int] = ..., last_log_index: _Optional[int] = ..., commit_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., members: _Optional[_Iterable[_Union[MemberProgress, _Mapping]]] = ..., namespaces: _Optional[_Iterable[_Union[NamespaceCounts, _Mapping]]] = ...) -> None: ...

class MemberProgress(_message.Message):
    __slots__ = ("node_id", "addr", "voter", "leader", "matched_index", "lag")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    VOTER_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    MATCHED_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    addr: str
    voter: bool
    leader: bool
    matched_index: int
    lag: int
    def __init__(self, node_id: _Optional[int] = ..., addr: _Optional[str] = ..., voter: _Optional[bool] = ..., leader: _Optional[bool] = ..., matched_index: _Optional[int] = ..., lag: _Optional[int] = ...) -> None: ...

class NamespaceCounts(_message.Message):
    __slots__ = ("name", "pending", "stored", "configured", "paused", "by_state", "by_state_partial", "group")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    CONFIGURED_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    BY_STATE_FIELD_NUMBER: _ClassVar[int]
    BY_STATE_PARTIAL_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    name: str
    pending: int
    stored: int
    configured: bool
    paused: bool
    by_state: _containers.RepeatedCompositeFieldContainer[StateCount]
    by_state_partial: bool
    group: int
    def __init__(self, name: _Optional[str] = ..., pending: _Optional[int] = ..., stored: _Optional[int] = ..., configured: _Optional[bool] = ..., paused: _Optional[bool] = ..., by_state: _Optional[_Iterable[_Union[StateCount, _Mapping]]] = ..., by_state_partial: _Optional[bool] = ..., group: _Optional[int] = ...) -> None: ...

class StateCount(_message.Message):
    __slots__ = ("state", "count")
    STATE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    state: TimerState
    count: int
    def __init__(self, state: _Optional[_Union[TimerState, str]] = ..., count: _Optional[int] = ...) -> None: ...

class BackupRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BackupInfo(_message.Message):
    __slots__ = ("index", "term", "bytes", "node_id", "snapshot_id")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    index: int
    term: int
    bytes: int
    node_id: int
    snapshot_id: str
    def __init__(self, index: _Optional[int] = ..., term: _Optional[int] = ..., bytes: _Optional[int] = ..., node_id: _Optional[int] = ..., snapshot_id: _Optional[str] = ...) -> None: ...

class BackupChunk(_message.Message):
    __slots__ = ("info", "data")
    INFO_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    info: BackupInfo
    data: bytes
    def __init__(self, info: _Optional[_Union[BackupInfo, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class NamespacePolicy(_message.Message):
    __slots__ = ("ack_timeout_ms", "max_attempts", "backoff_min_ms", "backoff_max_ms", "backoff_multiplier_permille", "backoff_jitter_percent", "retention_ms", "max_payload_bytes", "push", "max_dispatches_per_second", "max_burst", "max_concurrent_dispatches", "max_schedules_per_second", "max_schedule_burst", "paused", "max_lateness_ms", "misfire")
    ACK_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_MIN_MS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_MAX_MS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_MULTIPLIER_PERMILLE_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_JITTER_PERCENT_FIELD_NUMBER: _ClassVar[int]
    RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    PUSH_FIELD_NUMBER: _ClassVar[int]
    MAX_DISPATCHES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    MAX_BURST_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_DISPATCHES_FIELD_NUMBER: _ClassVar[int]
    MAX_SCHEDULES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    MAX_SCHEDULE_BURST_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    MAX_LATENESS_MS_FIELD_NUMBER: _ClassVar[int]
    MISFIRE_FIELD_NUMBER: _ClassVar[int]
    ack_timeout_ms: int
    max_attempts: int
    backoff_min_ms: int
    backoff_max_ms: int
    backoff_multiplier_permille: int
    backoff_jitter_percent: int
    retention_ms: int
    max_payload_bytes: int
    push: PushTarget
    max_dispatches_per_second: int
    max_burst: int
    max_concurrent_dispatches: int
    max_schedules_per_second: int
    max_schedule_burst: int
    paused: bool
    max_lateness_ms: int
    misfire: MisfireAction
    def __init__(self, ack_timeout_ms: _Optional[int] = ..., max_attempts: _Optional[int] = ..., backoff_min_ms: _Optional[int] = ..., backoff_max_ms: _Optional[int] = ..., backoff_multiplier_permille: _Optional[int] = ..., backoff_jitter_percent: _Optional[int] = ..., retention_ms: _Optional[int] = ..., max_payload_bytes: _Optional[int] = ..., push: _Optional[_Union[PushTarget, _Mapping]] = ..., max_dispatches_per_second: _Optional[int] = ..., max_burst: _Optional[int] = ..., max_concurrent_dispatches: _Optional[int] = ..., max_schedules_per_second: _Optional[int] = ..., max_schedule_burst: _Optional[int] = ..., paused: _Optional[bool] = ..., max_lateness_ms: _Optional[int] = ..., misfire: _Optional[_Union[MisfireAction, str]] = ...) -> None: ...

class PushTarget(_message.Message):
    __slots__ = ("url", "secrets", "timeout_ms", "dead_on_client_error")
    URL_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    DEAD_ON_CLIENT_ERROR_FIELD_NUMBER: _ClassVar[int]
    url: str
    secrets: _containers.RepeatedScalarFieldContainer[str]
    timeout_ms: int
    dead_on_client_error: bool
    def __init__(self, url: _Optional[str] = ..., secrets: _Optional[_Iterable[str]] = ..., timeout_ms: _Optional[int] = ..., dead_on_client_error: _Optional[bool] = ...) -> None: ...

class PauseNamespaceRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class PauseNamespaceResponse(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: Namespace
    def __init__(self, namespace: _Optional[_Union[Namespace, _Mapping]] = ...) -> None: ...

class Namespace(_message.Message):
    __slots__ = ("name", "policy", "configured")
    NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CONFIGURED_FIELD_NUMBER: _ClassVar[int]
    name: str
    policy: NamespacePolicy
    configured: bool
    def __init__(self, name: _Optional[str] = ..., policy: _Optional[_Union[NamespacePolicy, _Mapping]] = ..., configured: _Optional[bool] = ...) -> None: ...

class PutNamespaceRequest(_message.Message):
    __slots__ = ("name", "policy")
    NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    name: str
    policy: NamespacePolicy
    def __init__(self, name: _Optional[str] = ..., policy: _Optional[_Union[NamespacePolicy, _Mapping]] = ...) -> None: ...

class PutNamespaceResponse(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: Namespace
    def __init__(self, namespace: _Optional[_Union[Namespace, _Mapping]] = ...) -> None: ...

class GetNamespaceRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetNamespaceResponse(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: Namespace
    def __init__(self, namespace: _Optional[_Union[Namespace, _Mapping]] = ...) -> None: ...

class ListNamespacesRequest(_message.Message):
    __slots__ = ("limit", "page_token")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    limit: int
    page_token: str
    def __init__(self, limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListNamespacesResponse(_message.Message):
    __slots__ = ("namespaces", "next_page_token")
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    namespaces: _containers.RepeatedCompositeFieldContainer[Namespace]
    next_page_token: str
    def __init__(self, namespaces: _Optional[_Iterable[_Union[Namespace, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class KeyInfo(_message.Message):
    __slots__ = ("id", "name", "roles", "cert_name", "created_at_ms", "has_secret")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    CERT_NAME_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    HAS_SECRET_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    cert_name: str
    created_at_ms: int
    has_secret: bool
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ..., cert_name: _Optional[str] = ..., created_at_ms: _Optional[int] = ..., has_secret: _Optional[bool] = ...) -> None: ...

class CreateKeyRequest(_message.Message):
    __slots__ = ("name", "roles", "cert_name", "no_secret")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    CERT_NAME_FIELD_NUMBER: _ClassVar[int]
    NO_SECRET_FIELD_NUMBER: _ClassVar[int]
    name: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    cert_name: str
    no_secret: bool
    def __init__(self, name: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ..., cert_name: _Optional[str] = ..., no_secret: _Optional[bool] = ...) -> None: ...

class CreateKeyResponse(_message.Message):
    __slots__ = ("key", "token")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    key: KeyInfo
    token: str
    def __init__(self, key: _Optional[_Union[KeyInfo, _Mapping]] = ..., token: _Optional[str] = ...) -> None: ...

class RevokeKeyRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class RevokeKeyResponse(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: KeyInfo
    def __init__(self, key: _Optional[_Union[KeyInfo, _Mapping]] = ...) -> None: ...

class ListKeysRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListKeysResponse(_message.Message):
    __slots__ = ("keys", "auth_enabled")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    AUTH_ENABLED_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[KeyInfo]
    auth_enabled: bool
    def __init__(self, keys: _Optional[_Iterable[_Union[KeyInfo, _Mapping]]] = ..., auth_enabled: _Optional[bool] = ...) -> None: ...

class SetAuthRequest(_message.Message):
    __slots__ = ("enabled",)
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    def __init__(self, enabled: _Optional[bool] = ...) -> None: ...

class SetAuthResponse(_message.Message):
    __slots__ = ("enabled",)
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    def __init__(self, enabled: _Optional[bool] = ...) -> None: ...

class WhoAmIRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WhoAmIResponse(_message.Message):
    __slots__ = ("auth_enabled", "principal", "roles")
    AUTH_ENABLED_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    auth_enabled: bool
    principal: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, auth_enabled: _Optional[bool] = ..., principal: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ...) -> None: ...
