//! A row of the wheel: one timer as it was placed, and how its state is derived from the row
//! and the replicated cursors.
//!
//! A row is written when a timer is created, moved (cancel, reschedule, a deadline passed, a
//! nack, a redrive) or acked alone; nothing else writes it. What happened to it in between is
//! read off the cursors: a `Pending` row behind the fire cursor has fired (its fire index and
//! time are in the `fires` record that covers its slot), a fired row behind its namespace's
//! delivery cursor is in the lease that covers its slot (in flight until the lease's deadline,
//! or acked if the lease was acked whole). [`derive`] turns a row into the [`Timer`] a client
//! sees; the state machine and the read side both use it, through [`Lookup`].
//!
//! Encoding: `kind: u8 | fire_at_ms: i64 BE | bincode body | bincode ext`. The fixed header lets
//! a scan count fired timers and their lateness without decoding ids and payloads. The `ext`
//! holds what storage format 5 added (the revision); a format-4 row ends after its body and
//! reads with the defaults.

use serde::{Deserialize, Serialize};

use super::codec;
use crate::timer::{
    AttemptRecord, Channel, Outcome, Phase, SpecRef, Timer, TimerKey, TimerState, When,
};
use crate::wheel::Slot;
use crate::{Error, Result};

/// What a row waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Scheduled (or redriven): fires when the cursor passes it; then delivered from it.
    Pending = 0,
    /// Fired and delivered `attempts` times without an ack: delivered again once the cursor
    /// passes it (its slot is the redelivery time).
    Retry = 1,
    Acked = 2,
    Cancelled = 3,
    Dead = 4,
    /// Found too late to fire, under the misfire action `skip`.
    Expired = 5,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            0 => Kind::Pending,
            1 => Kind::Retry,
            2 => Kind::Acked,
            3 => Kind::Cancelled,
            4 => Kind::Dead,
            5 => Kind::Expired,
            _ => return None,
        })
    }

    /// Whether a row of this kind is handed to consumers once the cursor has passed it.
    pub fn deliverable(self) -> bool {
        matches!(self, Kind::Pending | Kind::Retry)
    }
}

/// One row: a timer as placed, with the history it carried when it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub kind: Kind,
    pub fire_at_ms: i64,
    pub body: Body,
}

/// Everything of a row but its header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Body {
    pub id: String,
    pub payload: Vec<u8>,
    pub created_at_ms: i64,
    pub scheduled_when: When,
    /// Deliveries made (not counting one in flight under a lease).
    pub attempts: u32,
    pub attempt_base: u32,
    /// Known once a row was rewritten after its fire (0 in a `Pending` row: see `fires`).
    pub fired_at_ms: i64,
    pub fire_index: u64,
    pub last_delivered_at_ms: i64,
    pub nacks: u32,
    pub timeouts: u32,
    pub redrives: u32,
    pub finished_at_ms: i64,
    /// A `Retry` row's redelivery time (its slot's bucket may be later: the cursor's).
    pub wake_at_ms: i64,
    pub content_type: String,
    /// The attempts whose outcome was written with the row (the latest ten).
    pub log: Vec<AttemptRecord>,
    /// Encoded after the body (see the module essay).
    #[serde(skip)]
    pub ext: Ext,
}

/// What a row holds beyond its format-4 body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ext {
    /// The timer's revision when the row was written (0 in a format-4 row: read as 1). What
    /// the cursors did since adds to it: see [`derive`].
    pub revision: u64,
    /// The timer's own misfire policy (`None`: its namespace's). A row that has one says so
    /// in its kind byte ([`OWN_MISFIRE`]), so the fire cursor decodes only those.
    pub misfire: Option<crate::namespace::Misfire>,
}

/// Set in a row's kind byte when the row carries its own misfire policy.
pub const OWN_MISFIRE: u8 = 0x80;

impl Row {
    pub fn encode(&self) -> Vec<u8> {
        // One buffer, sized for the usual body, the body encoded straight into it (not encoded
        // apart and copied after the header: that was an allocation and a copy of the payload
        // per row written, on every node).
        let mut out = Vec::with_capacity(9 + 64 + self.body.id.len() + self.body.payload.len());
        let flag = if self.body.ext.misfire.is_some() {
            OWN_MISFIRE
        } else {
            0
        };
        out.push(self.kind as u8 | flag);
        out.extend_from_slice(&self.fire_at_ms.to_be_bytes());
        codec::encode_into(&self.body, &mut out);
        codec::encode_into(&self.body.ext, &mut out);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Row> {
        let (kind, fire_at_ms) = header(bytes)?;
        let (mut body, read): (Body, usize) = codec::decode_prefix(&bytes[9..])?;
        let rest = &bytes[9 + read..];
        if !rest.is_empty() {
            body.ext = codec::decode(rest)?;
        }
        Ok(Row {
            kind,
            fire_at_ms,
            body,
        })
    }
}

/// A row's kind and fire time, without decoding the rest.
pub fn header(bytes: &[u8]) -> Result<(Kind, i64)> {
    let corrupt = || Error::Storage(format!("corrupt row of {} bytes", bytes.len()));
    let (&kind, rest) = bytes.split_first().ok_or_else(corrupt)?;
    let (at, _) = rest.split_first_chunk::<8>().ok_or_else(corrupt)?;
    Ok((
        Kind::from_u8(kind & !OWN_MISFIRE).ok_or_else(corrupt)?,
        i64::from_be_bytes(*at),
    ))
}

/// Whether a row carries its own misfire policy, read off its kind byte.
pub fn own_misfire(bytes: &[u8]) -> bool {
    bytes.first().is_some_and(|k| k & OWN_MISFIRE != 0)
}

/// A lease: fired timers of one namespace handed out together, the deliverable rows of the
/// slots `(from, to]` (the lease's key is its namespace and `to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub from: Slot,
    pub delivered_at_ms: i64,
    pub deadline_ms: i64,
    /// Deliverable rows it took (each delivered as its `attempts + 1`).
    pub count: u32,
    /// Rows of any kind in its range (a purge deletes them).
    pub rows: u32,
    /// Its deliveries are pushes (the leader's pusher holds them), not a stream's.
    pub push: bool,
    /// Once settled, its rows are finished or moved away; `acked`: every delivery was acked.
    pub settled: Option<Settled>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settled {
    pub at_ms: i64,
    pub acked: bool,
}

/// What [`derive`] needs besides the row: the replicated cursors, the lease covering a slot,
/// the fire record covering a slot and the namespace's retention. Implemented over the
/// database (the read side) and over an entry being applied (which sees its own writes).
pub trait Lookup {
    /// The fire cursor of `namespace`'s hash slot.
    fn cursor(&mut self, namespace: &str) -> Result<Slot>;
    fn delivered_to(&mut self, namespace: &str) -> Result<Slot>;
    /// The lease of `namespace` whose range holds `slot`: its end and the lease.
    fn lease_at(&mut self, namespace: &str, slot: Slot) -> Result<Option<(Slot, Lease)>>;
    /// The (fire index, fired_at) of the Fire entry that passed `namespace`'s row at `slot`.
    fn fire_at(&mut self, namespace: &str, slot: Slot) -> Result<(u64, i64)>;
    fn retention_ms(&mut self, namespace: &str) -> Result<u64>;
}

/// The timer a client sees for the row of `namespace` at `slot`.
pub fn derive(namespace: &str, slot: Slot, row: &Row, lk: &mut impl Lookup) -> Result<Timer> {
    let b = &row.body;
    let mut t = Timer {
        key: TimerKey::new(namespace, b.id.clone()),
        fire_at_ms: row.fire_at_ms,
        payload: b.payload.clone(),
        state: TimerState::Fired,
        attempts: b.attempts,
        created_at_ms: b.created_at_ms,
        fired_at_ms: b.fired_at_ms,
        fire_index: b.fire_index,
        finished_at_ms: b.finished_at_ms,
        scheduled_when: b.scheduled_when,
        phase: Phase::Ready,
        wake_at_ms: 0,
        attempt_base: b.attempt_base,
        last_delivered_at_ms: b.last_delivered_at_ms,
        nacks: b.nacks,
        timeouts: b.timeouts,
        redrives: b.redrives,
        content_type: b.content_type.clone(),
        attempt_log: b.log.clone(),
        revision: b.ext.revision.max(1),
    };
    match row.kind {
        Kind::Acked | Kind::Cancelled | Kind::Dead | Kind::Expired => {
            t.state = match row.kind {
                Kind::Acked => TimerState::Acked,
                Kind::Cancelled => TimerState::Cancelled,
                Kind::Expired => TimerState::Expired,
                _ => TimerState::Dead,
            };
            let retention = lk.retention_ms(namespace)?;
            t.wake_at_ms = t.finished_at_ms.saturating_add(retention as i64);
        }
        Kind::Pending if slot > lk.cursor(namespace)? => {
            t.state = TimerState::Pending;
            t.wake_at_ms = row.fire_at_ms;
        }
        Kind::Retry if slot > lk.cursor(namespace)? => {
            t.phase = Phase::Backoff;
            t.wake_at_ms = b.wake_at_ms;
        }
        Kind::Pending | Kind::Retry => {
            if row.kind == Kind::Pending {
                (t.fire_index, t.fired_at_ms) = lk.fire_at(namespace, slot)?;
                t.revision += 1; // PENDING -> FIRED
            }
            if slot > lk.delivered_to(namespace)? {
                return Ok(t); // READY
            }
            let Some((_, lease)) = lk.lease_at(namespace, slot)? else {
                return Err(Error::Storage(format!(
                    "row {namespace}/{} at {slot} is handed out but no lease holds it",
                    b.id
                )));
            };
            t.attempts += 1;
            t.last_delivered_at_ms = lease.delivered_at_ms;
            // The attempt the row does not record yet, read off its lease (never stored:
            // `materialize` drops it, and whoever rewrites the row records the outcome).
            let mut current = AttemptRecord {
                at_ms: lease.delivered_at_ms,
                attempt: t.attempts,
                channel: if lease.push {
                    Channel::Push
                } else {
                    Channel::Subscribe
                },
                outcome: Outcome::InFlight,
                latency_ms: 0,
                detail: String::new(),
            };
            match lease.settled {
                None => {
                    t.phase = Phase::InFlight;
                    t.wake_at_ms = lease.deadline_ms;
                }
                Some(Settled { at_ms, acked: true }) => {
                    t.state = TimerState::Acked;
                    t.revision += 1;
                    t.finished_at_ms = at_ms;
                    let retention = lk.retention_ms(namespace)?;
                    t.wake_at_ms = at_ms.saturating_add(retention as i64);
                    current.at_ms = at_ms;
                    current.outcome = Outcome::Acked;
                    current.latency_ms = latency_ms(lease.delivered_at_ms, at_ms);
                }
                Some(Settled { acked: false, .. }) => {
                    return Err(Error::Storage(format!(
                        "row {namespace}/{} at {slot} outlived its settled lease",
                        b.id
                    )))
                }
            }
            crate::timer::log_attempt(&mut t.attempt_log, current);
        }
    }
    Ok(t)
}

/// Milliseconds from `from` to `to`, for an attempt record (0 if the clock went back).
pub fn latency_ms(from: i64, to: i64) -> u32 {
    to.saturating_sub(from).clamp(0, u32::MAX as i64) as u32
}

/// The row of a timer as `t` shows it, ready to be written as `kind`: what the cursors and
/// leases said of it becomes part of the row (it moves, or is acked alone). Its revision is
/// one more than `t`'s, but for a `Retry` row (a delivery failed: no change of state).
pub fn materialize(t: &Timer, kind: Kind) -> Row {
    let revision = t.revision + u64::from(kind != Kind::Retry);
    Row {
        kind,
        fire_at_ms: t.fire_at_ms,
        body: Body {
            id: t.key.id.clone(),
            payload: t.payload.clone(),
            created_at_ms: t.created_at_ms,
            scheduled_when: t.scheduled_when,
            attempts: t.attempts,
            attempt_base: t.attempt_base,
            fired_at_ms: t.fired_at_ms,
            fire_index: t.fire_index,
            last_delivered_at_ms: t.last_delivered_at_ms,
            nacks: t.nacks,
            timeouts: t.timeouts,
            redrives: t.redrives,
            finished_at_ms: t.finished_at_ms,
            wake_at_ms: 0,
            content_type: t.content_type.clone(),
            log: t
                .attempt_log
                .iter()
                .filter(|r| r.outcome != Outcome::InFlight)
                .cloned()
                .collect(),
            ext: Ext {
                revision,
                misfire: None,
            },
        },
    }
}

/// The row of a timer `spec` creates at `now_ms`:
/// `materialize(&Timer::pending(spec, now_ms), Kind::Pending)` without the `Timer`.
pub fn pending(spec: SpecRef<'_>, now_ms: i64) -> Row {
    Row {
        kind: Kind::Pending,
        fire_at_ms: spec.when.resolve(now_ms),
        body: Body {
            id: spec.key.id.to_owned(),
            payload: spec.payload.to_vec(),
            created_at_ms: now_ms,
            scheduled_when: spec.when,
            attempts: 0,
            attempt_base: 0,
            fired_at_ms: 0,
            fire_index: 0,
            last_delivered_at_ms: 0,
            nacks: 0,
            timeouts: 0,
            redrives: 0,
            finished_at_ms: 0,
            wake_at_ms: 0,
            content_type: spec.content_type.to_owned(),
            log: Vec::new(),
            ext: Ext {
                revision: 1,
                misfire: None,
            },
        },
    }
}

/// The encoded row of a timer `spec` creates at `now_ms`: the bytes of
/// `materialize(&Timer::pending(spec, now_ms), Kind::Pending).encode()`, written from the spec
/// where it lies (a ScheduleBatch writes thousands of these per entry, on every node; copying
/// each id and payload into a `Row` first cost two allocations and two copies per timer).
pub fn encode_pending(spec: SpecRef<'_>, now_ms: i64) -> Vec<u8> {
    /// `Body`'s fields, in its order, with the id and the payload borrowed (serde writes a
    /// `&str` as a `String` and a `&[u8]` as a `Vec<u8>`).
    #[derive(Serialize)]
    struct PendingBody<'a> {
        id: &'a str,
        payload: &'a [u8],
        created_at_ms: i64,
        scheduled_when: When,
        attempts: u32,
        attempt_base: u32,
        fired_at_ms: i64,
        fire_index: u64,
        last_delivered_at_ms: i64,
        nacks: u32,
        timeouts: u32,
        redrives: u32,
        finished_at_ms: i64,
        wake_at_ms: i64,
        content_type: &'a str,
        log: &'a [AttemptRecord],
    }
    let body = PendingBody {
        id: spec.key.id,
        payload: spec.payload,
        created_at_ms: now_ms,
        scheduled_when: spec.when,
        attempts: 0,
        attempt_base: 0,
        fired_at_ms: 0,
        fire_index: 0,
        last_delivered_at_ms: 0,
        nacks: 0,
        timeouts: 0,
        redrives: 0,
        finished_at_ms: 0,
        wake_at_ms: 0,
        content_type: spec.content_type,
        log: &[],
    };
    let mut out = Vec::with_capacity(9 + 64 + spec.key.id.len() + spec.payload.len());
    out.push(Kind::Pending as u8);
    out.extend_from_slice(&spec.when.resolve(now_ms).to_be_bytes());
    codec::encode_into(&body, &mut out);
    codec::encode_into(
        &Ext {
            revision: 1,
            misfire: None,
        },
        &mut out,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_row_made_from_its_spec_is_the_materialized_row() {
        let now = 1_800_000_000_000;
        for (id, payload, when) in [
            ("a", vec![], When::At(now + 5)),
            ("id-2", b"payload".to_vec(), When::After(50)),
            (
                "x".repeat(300).as_str(),
                vec![7u8; 70_000],
                When::At(now - 9),
            ),
        ] {
            let spec = crate::timer::TimerSpec {
                key: TimerKey::new("ns", id),
                when,
                payload,
                content_type: if id == "a" {
                    String::new()
                } else {
                    "text/plain".into()
                },
            };
            let mut row = materialize(&Timer::pending(spec.clone(), now), Kind::Pending);
            // `materialize` writes a change (one revision up); a new timer is at revision 1.
            assert_eq!(row.body.ext.revision, 2);
            row.body.ext.revision = 1;
            assert_eq!(pending(spec.as_ref(), now), row, "{id:.8}");
            assert_eq!(encode_pending(spec.as_ref(), now), row.encode(), "{id:.8}");
        }
    }

    fn row(kind: Kind) -> Row {
        Row {
            kind,
            fire_at_ms: 1_800_000_000_000,
            body: Body {
                id: "id-1".into(),
                payload: b"payload".to_vec(),
                created_at_ms: 7,
                scheduled_when: When::After(50),
                attempts: 2,
                attempt_base: 1,
                fired_at_ms: 9,
                fire_index: 10,
                last_delivered_at_ms: 11,
                nacks: 1,
                timeouts: 1,
                redrives: 1,
                finished_at_ms: 12,
                wake_at_ms: 13,
                content_type: "application/json".into(),
                ext: Ext {
                    revision: 4,
                    misfire: None,
                },
                log: vec![AttemptRecord {
                    at_ms: 5,
                    attempt: 1,
                    channel: Channel::Push,
                    outcome: Outcome::Http(503),
                    latency_ms: 20,
                    detail: "busy".into(),
                }],
            },
        }
    }

    /// A format-4 row (no ext after its body) reads with revision 0, derived as 1.
    #[test]
    fn a_format_4_row_reads_without_its_extension() {
        let r = row(Kind::Acked);
        let bytes = r.encode();
        let ext_len = codec::encode(&r.body.ext).len();
        let four = &bytes[..bytes.len() - ext_len];
        let back = Row::decode(four).unwrap();
        assert_eq!(back.body.ext, Ext::default());
        assert_eq!(
            Row {
                body: Body {
                    ext: r.body.ext,
                    ..back.body
                },
                ..back
            },
            r
        );
    }

    #[test]
    fn rows_round_trip_and_headers_read_alone() {
        for kind in [
            Kind::Pending,
            Kind::Retry,
            Kind::Acked,
            Kind::Cancelled,
            Kind::Dead,
        ] {
            let r = row(kind);
            let bytes = r.encode();
            assert_eq!(Row::decode(&bytes).unwrap(), r);
            assert_eq!(header(&bytes).unwrap(), (kind, r.fire_at_ms));
        }
        assert!(
            header(&[9, 0, 0, 0, 0, 0, 0, 0, 0]).is_err(),
            "unknown kind"
        );
        assert!(header(&[0, 1, 2]).is_err(), "truncated");
        assert!(Row::decode(&row(Kind::Acked).encode()[..12]).is_err());
    }

    #[test]
    fn materialize_keeps_the_history() {
        let r = row(Kind::Retry);
        struct NoLookup;
        impl Lookup for NoLookup {
            fn cursor(&mut self, _: &str) -> Result<Slot> {
                Ok(Slot::ZERO)
            }
            fn delivered_to(&mut self, _: &str) -> Result<Slot> {
                unreachable!()
            }
            fn lease_at(&mut self, _: &str, _: Slot) -> Result<Option<(Slot, Lease)>> {
                unreachable!()
            }
            fn fire_at(&mut self, _: &str, _: Slot) -> Result<(u64, i64)> {
                unreachable!()
            }
            fn retention_ms(&mut self, _: &str) -> Result<u64> {
                unreachable!()
            }
        }
        // After the cursor: backing off, due at its redelivery time.
        let t = derive("ns", Slot::new(5, 1), &r, &mut NoLookup).unwrap();
        assert_eq!(
            (t.state, t.phase, t.wake_at_ms),
            (TimerState::Fired, Phase::Backoff, 13)
        );
        let back = materialize(&t, Kind::Retry);
        assert_eq!(
            back.body.wake_at_ms, 0,
            "the caller sets a new redelivery time"
        );
        assert_eq!(
            Row {
                body: Body {
                    wake_at_ms: 13,
                    ..back.body
                },
                ..back
            },
            r
        );
    }
}
