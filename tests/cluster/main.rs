//! Integration tests: real 3-node timerdb clusters on loopback (in-process nodes in `inproc`,
//! real `timerd` processes in `process`, subscribers and acks in `delivery`). Each test is a
//! sequence of named phases.

mod auth;
mod backup;
mod balancing;
mod certs;
mod client;
mod consume;
mod consumer;
mod ctl;
mod delivery;
mod garbage;
mod groups;
mod harness;
mod http;
mod http_refusals;
mod http_tls;
mod inproc;
mod members;
mod modes;
mod observe;
mod operations;
mod process;
mod push;
mod push_http;
mod receiver;
mod recurring;
mod rejoin;
mod replicas;
mod resting;
mod retries;
mod routing;
mod secure_process;
mod slots;
mod slow_disk;
mod slow_link;
mod tls;
mod tls_members;
mod unary_ack;
mod upgrade;
