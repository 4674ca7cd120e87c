//! openraft's async runtime: tokio's, with one change — where its random numbers come from.
//!
//! openraft 0.10 draws an election timeout for every election and a random phase for its first
//! tick, from the runtime's `thread_rng`. tokio's is seeded by the operating system, so two
//! simulated runs of one seed (`timerdb-sim`, which checks that they agree) would elect at
//! different moments. [`Dice`] draws from the simulator's seeded world when one is installed on
//! the thread (`crate::sim`), and from the operating system's generator everywhere else: a
//! production node behaves as with tokio's runtime.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use openraft::OptionalSend;
use openraft_rt_tokio::{
    TokioInstant, TokioMpsc, TokioMutex, TokioOneshot, TokioRuntime, TokioWatch,
};

/// tokio's runtime for openraft, with [`Dice`] for its random numbers.
#[derive(Debug)]
pub struct Runtime(TokioRuntime);

impl openraft::AsyncRuntime for Runtime {
    type JoinError = tokio::task::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = tokio::task::JoinHandle<T>;
    type Sleep = tokio::time::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = tokio::time::error::Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = tokio::time::Timeout<T>;
    type ThreadLocalRng = Dice;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    fn thread_rng() -> Dice {
        Dice
    }

    type Mpsc = TokioMpsc;
    type Watch = TokioWatch;
    type Oneshot = TokioOneshot;
    type Mutex<T: OptionalSend + 'static> = TokioMutex<T>;

    fn new(threads: usize) -> Self {
        Runtime(TokioRuntime::new(threads))
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.0.block_on(future)
    }
}

/// openraft's random numbers: the simulator's seeded dice on a simulated thread, the operating
/// system's generator elsewhere.
pub struct Dice;

impl rand_core::TryRng for Dice {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok(self.try_next_u64()? as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(crate::sim::dice().unwrap_or_else(rand::random))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            let bytes = self.try_next_u64()?.to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::AsyncRuntime;
    use rand_core::Rng;

    /// A seeded world gives the same draws again; without one they come from the OS.
    #[tokio::test(start_paused = true)]
    async fn a_simulated_thread_draws_from_its_seed() {
        let draws = || {
            crate::sim::install(0, 42);
            let d: Vec<u64> = (0..4).map(|_| Runtime::thread_rng().next_u64()).collect();
            crate::sim::uninstall();
            d
        };
        let (one, two) = (draws(), draws());
        assert_eq!(one, two);
        let free: Vec<u64> = (0..4).map(|_| Runtime::thread_rng().next_u64()).collect();
        assert_ne!(one, free);
    }
}
