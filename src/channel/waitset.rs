//! One descriptor for everything a channel may wait on: the shared-memory wake socket,
//! the network module's descriptor and a timer for the network module's next deadline.
//! The channel's own wait sleeps on it, and so can an event loop.

use nemesis_net::sys::{Epoll, millis};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub(super) struct WaitSet {
    epoll: Epoll,
    timer: OwnedFd,
    events: Vec<libc::epoll_event>,
}

impl WaitSet {
    /// A set watching each of `fds` for input (an epoll descriptor among them reports
    /// what it watches), and a timer.
    pub(super) fn new(fds: &[BorrowedFd<'_>]) -> io::Result<Self> {
        let epoll = Epoll::new()?;
        // SAFETY: a plain system call with no pointers.
        let t =
            unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if t < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `t` was just made and nothing else owns it.
        let timer = unsafe { OwnedFd::from_raw_fd(t) };
        for fd in fds.iter().chain([&timer.as_fd()]) {
            epoll.ctl(libc::EPOLL_CTL_ADD, fd.as_raw_fd(), libc::EPOLLIN as u32, 0)?;
        }
        Ok(Self {
            epoll,
            timer,
            events: vec![libc::epoll_event { events: 0, u64: 0 }; 4],
        })
    }

    /// Makes the timer fire at `at` (at once if it has passed), or never. Setting it
    /// also takes back an earlier expiry that nobody read.
    pub(super) fn set_timer(&self, at: Option<Instant>) -> io::Result<()> {
        let value = match at {
            None => Duration::ZERO,
            Some(t) => t
                .saturating_duration_since(Instant::now())
                .max(Duration::from_nanos(1)),
        };
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: value.as_secs().min(i32::MAX as u64) as libc::time_t,
                tv_nsec: value.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: `spec` is a live itimerspec; the old value is not asked for.
        let rc = unsafe { libc::timerfd_settime(self.timer.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sleeps until something watched is ready or `timeout` passes; says which.
    pub(super) fn sleep(&mut self, timeout: Duration) -> io::Result<bool> {
        Ok(self.epoll.wait(&mut self.events, millis(timeout))? > 0)
    }
}

impl AsFd for WaitSet {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.epoll.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::{Channel, Header, NemesisChannel};
    use nemesis_net::{Cards, Identity, NetError};
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Table(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Cards for Table {
        fn card(&mut self, rank: u32) -> Result<Vec<u8>, NetError> {
            self.0.lock().unwrap().card(rank)
        }
    }

    /// Ranks 0 and 1 share a segment; rank 2 is alone on another "node"; all have a
    /// tcp netmod on loopback.
    fn mixed_job() -> Vec<NemesisChannel> {
        let table = Table::default();
        let none = |_: &str| None;
        let chans = crate::channel::nemesis::three_ranks(Duration::from_millis(50), |r| {
            let id = Identity {
                rank: r,
                size: 3,
                job_key: nemesis_net::auth::JobKey::from_bytes([7; 32]),
                addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
            };
            nemesis_net::open("tcp", id, Box::new(table.clone()), &none).unwrap()
        });
        *table.0.lock().unwrap() = chans
            .iter()
            .map(|c| c.netmod().unwrap().business_card())
            .collect();
        chans
    }

    fn readable(ch: &NemesisChannel, ms: i32) -> bool {
        let mut p = libc::pollfd {
            fd: ch.wait_fd().unwrap().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) > 0 }
    }

    /// Polls `chans[to]` (and the others, so their sends and handshakes go on) until a
    /// packet comes to it; returns its tag.
    fn next_tag(chans: &mut [NemesisChannel], to: usize) -> i32 {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let mut tag = None;
            for (i, ch) in chans.iter_mut().enumerate() {
                if i == to {
                    ch.poll(|p| tag = Some(p.header.tag)).unwrap();
                } else {
                    ch.poll(|_| panic!("a packet for the wrong rank")).unwrap();
                }
            }
            if let Some(t) = tag {
                return t;
            }
            assert!(Instant::now() < end, "nothing came");
        }
    }

    #[test]
    fn an_armed_channel_is_woken_by_shared_memory_and_by_the_network() {
        let mut ch = mixed_job();
        // First contact over tcp both ways, so connections exist.
        let h = |tag| Header {
            tag,
            ..Header::default()
        };
        ch[2].send_bytes(0, h(1), b"hello").unwrap();
        assert_eq!(next_tag(&mut ch, 0), 1);
        let settle = Instant::now() + Duration::from_millis(100);
        while Instant::now() < settle {
            for c in ch.iter_mut() {
                c.poll(|_| {}).unwrap();
            }
        }

        assert!(ch[0].arm().unwrap(), "nothing to do, so it may sleep");
        assert!(!readable(&ch[0], 20), "nothing happened yet");
        ch[1].send_bytes(0, h(2), b"shm").unwrap();
        assert!(readable(&ch[0], 5000), "a local send wakes an armed channel");
        assert_eq!(next_tag(&mut ch, 0), 2);

        assert!(ch[0].arm().unwrap());
        assert!(!readable(&ch[0], 20), "the last wake-up was taken back");
        ch[2].send_bytes(0, h(3), b"net").unwrap();
        ch[2].flush(Duration::from_secs(10)).unwrap();
        assert!(readable(&ch[0], 5000), "a network send wakes an armed channel");
        assert_eq!(next_tag(&mut ch, 0), 3);

        // Not armed: local senders do not wake the socket (nor pay for it).
        ch[1].send_bytes(0, h(4), b"quiet").unwrap();
        assert!(
            !readable(&ch[0], 50),
            "a disarmed channel's descriptor stays quiet"
        );
        assert_eq!(next_tag(&mut ch, 0), 4);
        // With work already there, arming says so instead.
        ch[1].send_bytes(0, h(5), b"waiting").unwrap();
        assert!(!ch[0].arm().unwrap());
        assert_eq!(next_tag(&mut ch, 0), 5);
    }

    #[test]
    fn the_channels_own_wait_sleeps_on_both_and_returns_when_the_network_brings_work() {
        let mut ch = mixed_job();
        let h = Header::default();
        ch[2].send_bytes(0, h, b"hello").unwrap();
        assert_eq!(next_tag(&mut ch, 0), 0);
        let mut two = ch.pop().unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            two.send_bytes(0, h, b"late").unwrap();
            two.flush(Duration::from_secs(10)).unwrap();
            two
        });
        // A wait of up to a minute ends when the packet comes, not after it.
        let start = Instant::now();
        let mut got = 0;
        while got == 0 {
            ch[0].wait(Some(Duration::from_secs(60))).unwrap();
            got = ch[0].poll(|_| {}).unwrap();
            assert!(
                start.elapsed() < Duration::from_secs(50),
                "the wait missed the packet"
            );
        }
        drop(t.join().unwrap());
    }

    #[test]
    fn the_timer_makes_the_set_readable_and_setting_it_again_takes_that_back() {
        let mut w = WaitSet::new(&[]).unwrap();
        assert!(!w.sleep(Duration::ZERO).unwrap());
        w.set_timer(Some(Instant::now())).unwrap();
        assert!(w.sleep(Duration::from_secs(5)).unwrap());
        w.set_timer(None).unwrap();
        assert!(
            !w.sleep(Duration::ZERO).unwrap(),
            "disarming takes the expiry back"
        );
        w.set_timer(Some(Instant::now() + Duration::from_secs(3600)))
            .unwrap();
        assert!(!w.sleep(Duration::from_millis(10)).unwrap());
    }
}
