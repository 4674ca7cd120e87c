//! Resting groups: a data group with nothing to do stops its heartbeats, and its followers
//! their election timers, while one ping per node pair proves the leader's node alive
//! (docs/sharding.md §7).
//!
//! Each data group is a full openraft instance, and an idle one still costs: its leader's
//! heartbeat every 100 ms to each follower, each answered, each waking both cores and their
//! metrics watchers (64 idle groups took 81–91 % of a core on this machine). openraft 0.10's
//! runtime switch `tick(false)` parks a replica's ticker: no heartbeat, no election timer, no
//! wake-up. Parking is safe at any time — Raft's rules do not rest on heartbeats — but a
//! follower whose timer is parked never replaces a dead leader. So a follower parks only while
//! the leader's *node* is heard from and says it still leads the group in that term:
//!
//! - The leader's side: a group rests once its leader has seen nothing for `rest_after` (no new
//!   entry, every entry applied, every voter matched to the last). It is then named, with its
//!   term, in the [`Ping`] this node sends each member every [`PING_EVERY`]; the leader parks
//!   its own ticker only while every other voter confirmed (in its [`Pong`]) within
//!   [`CONFIRM_FRESH`], and turns it back on as soon as one did not (heartbeats resume).
//! - The follower's side: a member holds a group (parks its ticker) when its replica follows
//!   the pinging node in the named term (or knows no leader yet in that term: a restart), and
//!   lets go when no ping came for [`HOLD_FOR`], when a ping no longer names it, or when its
//!   replica's leader or term changed. `CONFIRM_FRESH` < `HOLD_FOR`: a leader that misses a
//!   confirmation resumes heartbeats before its follower lets go, so the follower, when its
//!   election timer runs again, has just heard from the leader and does not stand against it.
//! - Waking: a write to a resting group meets openraft's lapsed leader lease; the proposer
//!   (`propose::client_write`) triggers one heartbeat, whose acknowledgement renews it, and the
//!   write goes through. The next survey sees the new entry and wakes the group.
//!
//! Group 0 never rests (every data-group call takes its read index, and its followers learn
//! its commits from heartbeats). The state here is node-local and decides no entry's effect
//! (DESIGN 8): it only switches timers.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver as _;
use openraft::ServerState;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::Raft;
use crate::keys::Group;
use crate::raft_types::NodeId;

/// How often a node pings the members of the groups it leads and wants to rest.
pub const PING_EVERY: Duration = Duration::from_millis(100);
/// How recent every other voter's confirmation must be for a leader to keep its ticker parked.
pub const CONFIRM_FRESH: Duration = Duration::from_millis(250);
/// How long a follower holds a group after the last ping that named it.
pub const HOLD_FOR: Duration = Duration::from_millis(500);
/// What this node, leading a group, says of its followers' silence: its door reads it
/// (`node/quorum.rs`), since a resting leader hears from no quorum and that is no lost one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Silence {
    /// Never rested: silence counts from the last quorum acknowledgement.
    #[default]
    Heard,
    /// Resting: no heartbeat goes out, so none comes back.
    Resting,
    /// Woke at this instant: silence counts from it at most (the last acknowledgement is as
    /// old as the rest, and the first heartbeat's answer is a round trip away).
    WokeAt(Instant),
}

/// Where this node says it leads a group resting (see [`Silence`]).
pub type Resting = tokio::sync::watch::Sender<Silence>;

/// A node's ping: the groups it leads and asks to rest, each with its term.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Ping {
    pub from: NodeId,
    pub resting: Vec<(Group, u64)>,
}

/// The answer: the groups the answering node now holds for the pinging one, with the term.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Pong {
    pub held: Vec<(Group, u64)>,
}

/// This node's resting groups, as leader and as follower.
pub struct Rest {
    id: NodeId,
    /// How long a leader must have seen nothing; zero: groups never rest.
    after: Duration,
    /// This node's replica of each data group, and where it says it leads it resting.
    groups: BTreeMap<Group, (Raft, Resting)>,
    /// Each group's acker: a leadership a hand-over began in never rests.
    ackers: BTreeMap<Group, super::Acker>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The data groups this node leads, and how long each has been idle.
    leading: BTreeMap<Group, Lead>,
    /// The data groups this node follows and holds for their leader's node.
    held: BTreeMap<Group, Held>,
    /// Each group as last switched: whether this node leads it resting, whether its ticker
    /// is parked (a switch that changes nothing costs nothing: 64 groups are surveyed ten
    /// times a second).
    parked: BTreeMap<Group, (bool, bool)>,
}

/// A group this node leads, as last surveyed.
struct Lead {
    term: u64,
    last: Option<u64>,
    /// Since when nothing changed (or `None`: not settled).
    since: Instant,
    /// When each other voter last confirmed it holds the group in this term.
    confirmed: BTreeMap<NodeId, Instant>,
    /// The ticker is parked.
    resting: bool,
}

struct Held {
    leader: NodeId,
    term: u64,
    at: Instant,
}

/// What the survey reads of a replica's metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    state: ServerState,
    term: u64,
    leader: Option<NodeId>,
    last: Option<u64>,
    /// Every entry applied here, and (leading) every voter matched to the last.
    settled: bool,
    voters: Vec<NodeId>,
}

fn seen(raft: &Raft) -> Seen {
    let m = raft.metrics();
    let m = m.borrow_watched();
    let last = m.last_log_index;
    let applied = m.last_applied.as_ref().map(|l| l.index);
    let matched = match &m.replication {
        Some(r) => r.values().all(|l| l.as_ref().map(|l| l.index) == last),
        None => true,
    };
    Seen {
        state: m.state,
        term: m.current_term,
        leader: m.current_leader,
        last,
        settled: applied == last && matched,
        voters: m.membership_config.membership().voter_ids().collect(),
    }
}

impl Seen {
    /// Whether this replica may hold its ticker for `leader` of `term`.
    fn follows(&self, leader: NodeId, term: u64) -> bool {
        self.state == ServerState::Follower
            && self.term == term
            && self.leader.is_none_or(|l| l == leader)
    }
}

impl Rest {
    /// `groups`: this node's replica of each data group (group 0 never rests).
    pub fn new(
        id: NodeId,
        after: Duration,
        groups: impl IntoIterator<Item = (Group, Raft, Resting, super::Acker)>,
    ) -> Rest {
        let mut replicas = BTreeMap::new();
        let mut ackers = BTreeMap::new();
        for (g, raft, resting, acker) in groups {
            replicas.insert(g, (raft, resting));
            ackers.insert(g, acker);
        }
        Rest {
            id,
            after,
            groups: replicas,
            ackers,
            state: Mutex::new(State::default()),
        }
    }

    /// Whether any data group is hosted here (a node of one group pings nobody).
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Whether this node leads `group` and its ticker is parked.
    pub fn resting(&self, group: Group) -> bool {
        let state = self.lock();
        state.leading.get(&group).is_some_and(|l| l.resting)
    }

    /// Whether this node holds `group` for its leader (its ticker parked).
    pub fn held(&self, group: Group) -> bool {
        self.lock().held.contains_key(&group)
    }

    /// Why this node refuses `candidate`'s vote or pre-vote request in `group` at `now`, if it
    /// does: while the group rests under this node's leadership, or while this node holds it
    /// for its leader's node (heard from within [`HOLD_FOR`]). These stand in for the leases
    /// that refuse such requests while heartbeats flow (openraft's, lapsed while a group
    /// rests): without them one member whose hold lapsed a moment early would be granted its
    /// election by the resting leader itself and depose it. A transfer the leader asked for
    /// is never refused.
    pub fn refuses_vote(
        &self,
        group: Group,
        (candidate, transfer): (NodeId, bool),
        now: Instant,
    ) -> Option<String> {
        if transfer {
            return None;
        }
        let state = self.lock();
        if state.leading.get(&group).is_some_and(|l| l.resting) {
            return Some(format!(
                "group {group} rests under node {}'s leadership, which its members confirm",
                self.id
            ));
        }
        let held = state.held.get(&group);
        let held = held.filter(|h| h.leader != candidate && now - h.at <= HOLD_FOR)?;
        Some(format!(
            "this node holds group {group} for its leader, node {}, heard from {} ms ago",
            held.leader,
            (now - held.at).as_millis()
        ))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Looks at every group at `now`: which this node leads and may rest, which holds lapsed;
    /// switches the tickers; returns the ping to send every member.
    pub fn survey(&self, now: Instant) -> Ping {
        let mut state = self.lock();
        let mut resting = Vec::new();
        for (&g, replica) in &self.groups {
            let s = seen(&replica.0);
            // A leadership a hand-over began in sends no heartbeat and takes no write: if its
            // successor never takes over (a lost TransferLeader), only the members' elections
            // end it, so it is not named, its holds lapse and their tickers run.
            let handing_over = (self.ackers.get(&g)).is_some_and(|a| a.handed_over_in() >= s.term);
            if s.state == ServerState::Leader && s.leader == Some(self.id) && !handing_over {
                let lead = state.leading.entry(g).or_insert_with(|| Lead::new(&s, now));
                if lead.term != s.term || lead.last != s.last || !s.settled {
                    *lead = Lead::new(&s, now);
                }
                if !self.after.is_zero() && now.duration_since(lead.since) >= self.after {
                    resting.push((g, s.term));
                    let others = s.voters.iter().filter(|v| **v != self.id);
                    lead.resting = others.into_iter().all(|v| {
                        (lead.confirmed.get(v)).is_some_and(|at| now - *at <= CONFIRM_FRESH)
                    });
                }
            } else {
                state.leading.remove(&g);
            }
            if let Some(h) = state.held.get(&g) {
                if now - h.at > HOLD_FOR || !s.follows(h.leader, h.term) {
                    state.held.remove(&g);
                }
            }
            switch(g, replica, &mut state);
        }
        let gauge = |name, n: usize| metrics::gauge!(name).set(n as f64);
        gauge(
            crate::metrics::GROUPS_RESTING,
            state.leading.values().filter(|l| l.resting).count(),
        );
        gauge(crate::metrics::GROUPS_HELD, state.held.len());
        Ping {
            from: self.id,
            resting,
        }
    }

    /// A member's pong to the ping sent at `sent`: the groups it holds for this node are
    /// confirmed as of then (not of the answer's arrival: the member's hold runs from the
    /// ping, so a late answer must not stretch the leader's belief past it).
    pub fn on_pong(&self, from: NodeId, pong: &Pong, sent: Instant) {
        let mut state = self.lock();
        for (g, term) in &pong.held {
            if let Some(lead) = state.leading.get_mut(g) {
                if lead.term == *term {
                    let at = lead.confirmed.entry(from).or_insert(sent);
                    *at = (*at).max(sent);
                }
            }
        }
    }

    /// A ping from `ping.from`: holds each group it names that this node's replica follows
    /// it in, lets go of the others held for it; the answer names the groups now held.
    pub fn on_ping(&self, ping: &Ping, now: Instant) -> Pong {
        let mut state = self.lock();
        let mut held = Vec::new();
        for (&g, replica) in &self.groups {
            let asked = ping.resting.iter().find(|(n, _)| *n == g).map(|(_, t)| *t);
            match asked {
                Some(term) if ping.from != self.id && seen(&replica.0).follows(ping.from, term) => {
                    let leader = ping.from;
                    state.held.insert(
                        g,
                        Held {
                            leader,
                            term,
                            at: now,
                        },
                    );
                    held.push((g, term));
                }
                _ => {
                    if state.held.get(&g).is_some_and(|h| h.leader == ping.from) {
                        state.held.remove(&g);
                    }
                }
            }
            switch(g, replica, &mut state);
        }
        Pong { held }
    }
}

/// Pings every other voter of group 0 (the data groups' members, docs/sharding.md §2) every
/// [`PING_EVERY`] while this node has groups to rest, and once more after, so they let go at
/// once; until `shutdown`. One kept connection per peer, dialled again after a failure.
pub async fn run(
    rest: std::sync::Arc<Rest>,
    (zero, store): (Raft, crate::storage::Store),
    config: std::sync::Arc<crate::config::NodeConfig>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    if rest.is_empty() {
        return;
    }
    let mut channels: BTreeMap<NodeId, (String, tonic::transport::Channel)> = BTreeMap::new();
    let mut named_last = false;
    let mut every = tokio::time::interval(PING_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = every.tick() => {}
        }
        let ping = rest.survey(Instant::now());
        if ping.resting.is_empty() && !named_last {
            continue;
        }
        named_last = !ping.resting.is_empty();
        let sent = Instant::now();
        let peers: Vec<(NodeId, String)> = {
            let m = zero.metrics();
            let m = m.borrow_watched();
            let membership = m.membership_config.membership();
            (membership.voter_ids().filter(|id| *id != rest.id))
                .filter_map(|id| membership.get_node(&id).map(|n| (id, n.addr.clone())))
                .collect()
        };
        // Each ping on its own task: a peer that does not answer holds up no survey (the
        // holds' lapses are judged there). A channel reconnects by itself.
        for (id, addr) in peers {
            let addr = config.dial_addr(id, &addr);
            let channel = match channels.get(&id) {
                Some((a, ch)) if *a == addr => ch.clone(),
                _ => match config
                    .tls
                    .channel(&addr, |e| e.connect_timeout(CONFIRM_FRESH))
                {
                    Ok(ch) => {
                        channels.insert(id, (addr.clone(), ch.clone()));
                        ch
                    }
                    Err(e) => {
                        tracing::debug!(peer = id, error = %e, "ping: bad peer address");
                        continue;
                    }
                },
            };
            let (rest, config, store, ping) =
                (rest.clone(), config.clone(), store.clone(), ping.clone());
            tokio::spawn(async move {
                match send(&config, channel, &store, &ping).await {
                    Ok(pong) => rest.on_pong(id, &pong, sent),
                    Err(e) => tracing::debug!(peer = id, error = %e, "ping failed"),
                }
            });
        }
    }
}

/// Pings a member over `channel`: the groups it now holds for this node.
async fn send(
    config: &crate::config::NodeConfig,
    channel: tonic::transport::Channel,
    store: &crate::storage::Store,
    ping: &Ping,
) -> crate::Result<Pong> {
    use timerdb_proto::pb::{groups_client::GroupsClient, RaftMessage};
    let failed = |e: String| crate::Error::Unavailable(format!("ping: {e}"));
    let data = crate::storage::encode(ping);
    let mut request = super::network::peer_request(RaftMessage { data }, store, config);
    request.set_timeout(CONFIRM_FRESH);
    let reply = GroupsClient::new(channel)
        .ping(request)
        .await
        .map_err(|s| failed(s.message().to_string()))?;
    crate::storage::decode(&reply.into_inner().data).map_err(|e| failed(e.to_string()))
}

impl Lead {
    fn new(s: &Seen, now: Instant) -> Lead {
        Lead {
            term: s.term,
            last: s.last,
            since: now,
            confirmed: BTreeMap::new(),
            resting: false,
        }
    }
}

/// `g`'s ticker runs unless this node leads it resting or holds it for its leader.
fn switch(g: Group, (raft, resting): &(Raft, Resting), state: &mut State) {
    let leads_resting = state.leading.get(&g).is_some_and(|l| l.resting);
    let parked = leads_resting || state.held.contains_key(&g);
    if state.parked.insert(g, (leads_resting, parked)) == Some((leads_resting, parked)) {
        return;
    }
    // Said before the ticker stops, so the door never sees a silent leader it thinks awake.
    resting.send_if_modified(|was| match (leads_resting, *was) {
        (true, Silence::Resting) | (false, Silence::Heard | Silence::WokeAt(_)) => false,
        (true, _) => {
            *was = Silence::Resting;
            true
        }
        (false, Silence::Resting) => {
            *was = Silence::WokeAt(Instant::now());
            true
        }
    });
    raft.runtime_config().tick(!parked);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn follower(term: u64, leader: Option<NodeId>) -> Seen {
        Seen {
            state: ServerState::Follower,
            term,
            leader,
            last: Some(9),
            settled: true,
            voters: vec![1, 2, 3],
        }
    }

    /// A follower holds only for the leader it follows, in its term; after a restart (no
    /// leader known yet) for the one pinging in its term; never as a candidate or leader.
    #[test]
    fn a_follower_holds_only_for_its_leader_in_its_term() {
        assert!(follower(5, Some(2)).follows(2, 5));
        assert!(!follower(5, Some(2)).follows(3, 5));
        assert!(!follower(5, Some(2)).follows(2, 4));
        assert!(!follower(5, Some(2)).follows(2, 6));
        assert!(follower(5, None).follows(2, 5));
        let mut candidate = follower(5, None);
        candidate.state = ServerState::Candidate;
        assert!(!candidate.follows(2, 5));
    }

    /// A follower lets go after `HOLD_FOR` without a ping while a leader missing a
    /// confirmation resumes heartbeats after `CONFIRM_FRESH`: the leader first, by a ping or
    /// more, so a follower's election timer never runs while its leader is silent.
    #[test]
    fn a_leader_resumes_heartbeats_before_its_follower_lets_go() {
        assert!(CONFIRM_FRESH + PING_EVERY < HOLD_FOR);
        assert!(PING_EVERY * 2 <= CONFIRM_FRESH);
    }

    fn lead(term: u64, now: Instant, resting: bool) -> Lead {
        let seen = Seen {
            state: ServerState::Leader,
            ..follower(term, Some(1))
        };
        let mut lead = Lead::new(&seen, now);
        lead.resting = resting;
        lead
    }

    /// Review of 4f (MED 1): while a group rests, its leader and every member holding it
    /// refuse a vote or pre-vote, as the leases would if heartbeats flowed, so one member whose
    /// hold lapsed early cannot be elected by the resting leader's own grant; a transfer the
    /// leader asked for, the leader's own request, and any request once the hold lapsed pass.
    #[test]
    fn a_resting_group_refuses_votes_while_its_leader_is_heard_from() {
        let rest = Rest::new(1, REST_TEST, []);
        let t0 = Instant::now();
        rest.lock().held.insert(
            3,
            Held {
                leader: 2,
                term: 5,
                at: t0,
            },
        );
        let at = |ms| t0 + Duration::from_millis(ms);
        assert!(rest.refuses_vote(3, (4, false), at(100)).is_some());
        assert!(rest.refuses_vote(3, (4, true), at(100)).is_none());
        assert!(rest.refuses_vote(3, (2, false), at(100)).is_none());
        assert!(rest.refuses_vote(3, (4, false), at(600)).is_none());
        assert!(rest.refuses_vote(4, (4, false), at(100)).is_none());
        rest.lock().leading.insert(7, lead(5, t0, true));
        assert!(rest.refuses_vote(7, (2, false), at(100)).is_some());
        assert!(rest.refuses_vote(7, (2, true), at(100)).is_none());
        rest.lock().leading.insert(8, lead(5, t0, false));
        assert!(rest.refuses_vote(8, (2, false), at(100)).is_none());
    }

    /// A confirmation counts from the ping it answers, not from the answer's arrival (review of
    /// 4f, MED 1: a late answer stretched the leader's belief past the member's hold), and a
    /// late answer to an older ping never moves it back.
    #[test]
    fn a_confirmation_counts_from_its_ping() {
        let rest = Rest::new(1, REST_TEST, []);
        let t0 = Instant::now();
        rest.lock().leading.insert(3, lead(5, t0, false));
        let pong = Pong { held: vec![(3, 5)] };
        rest.on_pong(2, &pong, t0 + Duration::from_millis(100));
        rest.on_pong(2, &pong, t0);
        let stale = Pong { held: vec![(3, 4)] };
        rest.on_pong(4, &stale, t0 + Duration::from_millis(300));
        let state = rest.lock();
        let confirmed = &state.leading[&3].confirmed;
        assert_eq!(confirmed.get(&2), Some(&(t0 + Duration::from_millis(100))));
        assert_eq!(
            confirmed.get(&4),
            None,
            "a pong of another term confirms nothing"
        );
    }

    const REST_TEST: Duration = Duration::from_millis(300);
}
