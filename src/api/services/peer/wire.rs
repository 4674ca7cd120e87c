//! The two peer services on the wire: `timerdb.v1.Raft`, group 0's (and every call of a build
//! before groups), and `timerdb.v1.Groups`, the data groups' — the same calls, served by the
//! same handlers (`super`), each told which service it came to so that a data group's call is
//! only ever taken from `Groups` (a build before groups, which has no `Groups`, answers those
//! UNIMPLEMENTED instead of taking them for group 0's).

use tonic::{Request, Response, Status};

use super::{PeerService, Service};
use crate::api::pb::{groups_server, raft_server, RaftMessage};

type Answer = Result<Response<RaftMessage>, Status>;

#[tonic::async_trait]
impl raft_server::Raft for PeerService {
    async fn append_entries(&self, req: Request<RaftMessage>) -> Answer {
        PeerService::append_entries(self, Service::Raft, req).await
    }

    async fn vote(&self, req: Request<RaftMessage>) -> Answer {
        PeerService::vote(self, Service::Raft, req).await
    }

    async fn pre_vote(&self, req: Request<RaftMessage>) -> Answer {
        PeerService::pre_vote(self, Service::Raft, req).await
    }

    async fn install_snapshot(&self, req: Request<RaftMessage>) -> Answer {
        PeerService::install_snapshot(self, Service::Raft, req).await
    }

    async fn transfer_leader(&self, req: Request<RaftMessage>) -> Answer {
        PeerService::transfer_leader(self, Service::Raft, req).await
    }

    async fn timeout_now(&self, req: Request<RaftMessage>) -> Answer {
        PeerService::timeout_now(self, Service::Raft, req).await
    }

    async fn hello(&self, req: Request<RaftMessage>) -> Answer {
        PeerService::hello(self, Service::Raft, req).await
    }

    async fn read_index(&self, req: Request<RaftMessage>) -> Answer {
        PeerService::read_index(self, req).await
    }
}

#[tonic::async_trait]
impl groups_server::Groups for PeerService {
    async fn append_entries(&self, req: Request<RaftMessage>) -> Answer {
        PeerService::append_entries(self, Service::Groups, req).await
    }

    async fn vote(&self, req: Request<RaftMessage>) -> Answer {
        PeerService::vote(self, Service::Groups, req).await
    }

    async fn pre_vote(&self, req: Request<RaftMessage>) -> Answer {
        PeerService::pre_vote(self, Service::Groups, req).await
    }

    async fn install_snapshot(&self, req: Request<RaftMessage>) -> Answer {
        PeerService::install_snapshot(self, Service::Groups, req).await
    }

    async fn transfer_leader(&self, req: Request<RaftMessage>) -> Answer {
        PeerService::transfer_leader(self, Service::Groups, req).await
    }

    async fn timeout_now(&self, req: Request<RaftMessage>) -> Answer {
        PeerService::timeout_now(self, Service::Groups, req).await
    }

    async fn ping(&self, req: Request<RaftMessage>) -> Answer {
        PeerService::ping(self, req).await
    }

    async fn handover(&self, req: Request<RaftMessage>) -> Answer {
        PeerService::handover(self, req).await
    }

    async fn hello(&self, req: Request<RaftMessage>) -> Answer {
        PeerService::hello(self, Service::Groups, req).await
    }

    async fn member(&self, req: Request<RaftMessage>) -> Answer {
        PeerService::member(self, req).await
    }
}
