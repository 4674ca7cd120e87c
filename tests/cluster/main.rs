//! Integration tests: real 3-node timerdb clusters on loopback (in-process nodes in `inproc`,
//! real `timerd` processes in `process`). Each test is a sequence of named phases.

mod harness;
mod inproc;
mod process;
