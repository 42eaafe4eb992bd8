//! Two jobs at one rendezvous, and a squatter on it: the tests of issue 40.
//!
//! Each PE is a thread with a `LaunchEnv` of its own; two jobs with the same token and port are
//! what two jobs started by hand with identical environments look like to the rendezvous.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::wire::{Msg, HEADER_LEN};
use super::{auth, Bootstrap, LaunchEnv, Launcher, TcpBootstrap, TokenSource};
use crate::error::{Error, ErrorKind};

fn env(rank: usize, world: usize, port: u16, token: &str, one_node: bool) -> LaunchEnv {
    LaunchEnv {
        launcher: Launcher::TorchStyle,
        rank,
        world,
        local_rank: Some(rank),
        addr: "127.0.0.1".into(),
        port,
        token: token.as_bytes().to_vec(),
        token_source: TokenSource::Given,
        one_node,
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A token no other test (or earlier run) uses, so one-node sockets never collide.
fn unique(tag: &str) -> String {
    let mut n = [0u8; 8];
    getrandom::fill(&mut n).unwrap();
    format!(
        "{tag}-{}-{:016x}",
        std::process::id(),
        u64::from_le_bytes(n)
    )
}

/// Waits (at most 3 s) until `b` knows its job failed; returns the failure.
fn failure_of(b: &TcpBootstrap) -> Error {
    let until = Instant::now() + Duration::from_secs(3);
    while b.check().is_ok() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(2));
    }
    b.check().expect_err("the job did not fail")
}

const TWO_JOBS: &str = "two jobs share the rendezvous";

/// Reads one whole frame's bytes.
fn read_frame(s: &mut TcpStream) -> Vec<u8> {
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
    let mut p = vec![0u8; len];
    s.read_exact(&mut p).unwrap();
    [h.to_vec(), p].concat()
}

/// A process of another user listening on MASTER_PORT before PE 0: PE 1 connects to it, the
/// squatter answers with `forged`, and everything PE 1 sends is recorded. PE 1 must fail at
/// once, having sent nothing that holds the token and nothing at all after the forged reply.
fn squat(forged: Msg) -> (Error, Duration, Vec<u8>, Vec<u8>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let token = unique("squat-secret");
    let squatter = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let hello = read_frame(&mut s);
        forged.write_to(&mut s).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut after = Vec::new();
        let _ = s.read_to_end(&mut after);
        (hello, after)
    });
    let t0 = Instant::now();
    let e = TcpBootstrap::connect(&env(1, 2, port, &token, false), Duration::from_secs(10))
        .err()
        .expect("PE 1 joined a squatter");
    let took = t0.elapsed();
    let (hello, after) = squatter.join().unwrap();
    assert!(
        !hello.windows(token.len()).any(|w| w == token.as_bytes()),
        "the Hello carries the token"
    );
    // Nothing but what is public: rank, world, the nonce, the fingerprint and the token's
    // source (no pid, host name or twins for a listener that has not proved the token).
    let public = 4 + 4 + (4 + auth::NONCE_LEN) + (4 + 16) + (4 + "SYMHEAP_TOKEN".len());
    assert_eq!(hello.len(), HEADER_LEN + public, "the Hello carries more");
    (e, took, hello, after)
}

#[test]
fn a_squatter_learns_no_token_and_a_forged_welcome_gets_nothing() {
    let (e, took, _, after) = squat(Msg::Welcome);
    assert!(took < Duration::from_secs(2), "took {took:?}: {e}");
    assert!(matches!(e.kind(), ErrorKind::Bootstrap(_)), "{e}");
    assert!(e.to_string().contains("not this job's PE 0"), "{e}");
    assert!(
        after.is_empty(),
        "PE 1 sent {} bytes after a forged Welcome",
        after.len()
    );
}

#[test]
fn a_squatter_that_cannot_prove_the_token_gets_nothing() {
    let forged = Msg::Challenge {
        nonce: vec![1; auth::NONCE_LEN],
        mac: vec![2; auth::MAC_LEN],
    };
    let (e, took, _, after) = squat(forged);
    assert!(took < Duration::from_secs(2), "took {took:?}: {e}");
    let s = e.to_string();
    assert!(s.contains("did not prove it holds this job's token"), "{s}");
    assert!(
        after.is_empty(),
        "PE 1 sent {} bytes to a forger",
        after.len()
    );
}

/// A job of `world` PEs that meets and passes one all_gather; returns the live bootstraps.
fn running_job(world: usize, port: u16, token: &str, one_node: bool) -> Vec<TcpBootstrap> {
    let hs: Vec<JoinHandle<TcpBootstrap>> = (0..world)
        .map(|r| {
            let e = env(r, world, port, token, one_node);
            std::thread::spawn(move || {
                let b = TcpBootstrap::connect(&e, Duration::from_secs(20)).unwrap();
                b.all_gather("up", &[r as u8]).unwrap();
                b
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

fn a_second_pe_ends_the_running_job(one_node: bool, rank: usize) {
    let port = free_port();
    let token = unique("second");
    let job = running_job(2, port, &token, one_node);
    let t0 = Instant::now();
    let e = TcpBootstrap::connect(
        &env(rank, 2, port, &token, one_node),
        Duration::from_secs(10),
    )
    .err()
    .expect("a second PE joined a running job");
    assert!(t0.elapsed() < Duration::from_secs(3), "{e}");
    let s = e.to_string();
    assert!(
        s.contains(TWO_JOBS) && s.contains(&format!("PE {rank} (pid")),
        "{s}"
    );
    assert!(s.contains(&auth::fingerprint(token.as_bytes())), "{s}");
    for b in &job {
        let f = failure_of(b).to_string();
        assert!(f.contains(TWO_JOBS), "PE {}: {f}", b.rank());
    }
}

#[test]
fn a_second_pe_0_ends_the_running_job_tcp() {
    a_second_pe_ends_the_running_job(false, 0);
}

#[test]
fn a_second_pe_0_ends_the_running_job_unix() {
    a_second_pe_ends_the_running_job(true, 0);
}

#[test]
fn a_second_pe_1_after_admission_ends_the_job_tcp() {
    a_second_pe_ends_the_running_job(false, 1);
}

#[test]
fn a_second_pe_1_after_admission_ends_the_job_unix() {
    a_second_pe_ends_the_running_job(true, 1);
}

/// During admission: PEs 0 and 1 of a 3-PE job have met when a second PE 1 proves the token.
#[test]
fn a_taken_rank_during_admission_ends_the_job() {
    let port = free_port();
    let token = unique("dup-rank");
    let t = Duration::from_secs(10);
    let root = {
        let e = env(0, 3, port, &token, false);
        std::thread::spawn(move || TcpBootstrap::connect(&e, t).err())
    };
    let first = TcpBootstrap::connect(&env(1, 3, port, &token, false), t).unwrap();
    let e = TcpBootstrap::connect(&env(1, 3, port, &token, false), t)
        .err()
        .expect("a second PE 1 was admitted");
    assert!(e.to_string().contains(TWO_JOBS), "{e}");
    let e0 = root.join().unwrap().expect("PE 0 went on with its job");
    assert!(e0.to_string().contains(TWO_JOBS), "{e0}");
    let f = failure_of(&first).to_string();
    assert!(f.contains(TWO_JOBS), "{f}");
}

/// A PE of a second job that is still in its handshake when this job's last PE is admitted is
/// not dropped (it would retry, and might meet the other job's PE 0 once this job is over):
/// its proof, when it comes, ends the job.
#[test]
fn a_handshake_under_way_when_admission_ends_is_still_judged() {
    let port = free_port();
    let token = unique("under-way");
    let t = Duration::from_secs(10);
    let root = {
        let e = env(0, 2, port, &token, false);
        std::thread::spawn(move || TcpBootstrap::connect(&e, t).unwrap())
    };
    // The second job's PE 1 says Hello and gets PE 0's challenge, then waits.
    let mut s = loop {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let nonce = auth::nonce().unwrap();
    let mut hello = super::accept::tests::hello_for(token.as_bytes(), 1, 2);
    if let Msg::Hello { nonce: n, .. } = &mut hello {
        n.clone_from(&nonce);
    }
    hello.write_to(&mut s).unwrap();
    let Ok(Msg::Challenge { nonce: server, .. }) = Msg::read_from(&mut s) else {
        panic!("no challenge")
    };
    // This job's PE 1 joins: the job is complete.
    let pe1 = TcpBootstrap::connect(&env(1, 2, port, &token, false), t).unwrap();
    let pe0 = root.join().unwrap();
    // Now the waiting PE proves the token.
    let mac = auth::Transcript {
        client_nonce: &nonce,
        server_nonce: &server,
        rank: 1,
        world: 2,
        fingerprint: &auth::fingerprint(token.as_bytes()),
    }
    .mac(token.as_bytes(), auth::Side::Peer);
    super::accept::tests::proof_with(mac)
        .write_to(&mut s)
        .unwrap();
    let reply = Msg::read_from(&mut s);
    assert!(
        matches!(&reply, Ok(Msg::Reject { reason }) if reason.contains(TWO_JOBS)),
        "{reply:?}"
    );
    for b in [&pe0, &pe1] {
        let f = failure_of(b).to_string();
        assert!(f.contains(TWO_JOBS), "PE {}: {f}", b.rank());
    }
}

/// A PE of another job identity at a TCP rendezvous is refused at once (no retrying until the
/// timeout), and learns the port and both identities.
#[test]
fn another_job_at_the_port_is_refused_at_once() {
    let port = free_port();
    let job = running_job(2, port, "job-a", false);
    let t0 = Instant::now();
    let e = TcpBootstrap::connect(&env(1, 2, port, "job-b", false), Duration::from_secs(10))
        .err()
        .unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "{e}");
    let s = e.to_string();
    for want in [
        format!("127.0.0.1:{port}"),
        auth::fingerprint(b"job-a"),
        auth::fingerprint(b"job-b"),
    ] {
        assert!(s.contains(&want), "{want} not in {s}");
    }
    // The running job is not disturbed by a PE of another job.
    std::thread::scope(|sc| {
        for b in &job {
            sc.spawn(move || {
                b.barrier("after").unwrap();
                b.finalize().unwrap();
            });
        }
    });
}

/// A raw stranger who presents a wrong proof for rank 0 does not end the job: only a PE that
/// proves the token can.
#[test]
fn an_unproved_second_pe_0_changes_nothing() {
    let port = free_port();
    let token = unique("unproved");
    let job = running_job(2, port, &token, false);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    super::accept::tests::hello_for(token.as_bytes(), 0, 2)
        .write_to(&mut s)
        .unwrap();
    assert!(matches!(Msg::read_from(&mut s), Ok(Msg::Challenge { .. })));
    super::accept::tests::proof_with(vec![0; 32])
        .write_to(&mut s)
        .unwrap();
    assert!(matches!(Msg::read_from(&mut s), Ok(Msg::Reject { .. })));
    s.flush().unwrap();
    std::thread::scope(|sc| {
        for b in &job {
            sc.spawn(move || {
                b.barrier("after").unwrap();
                b.finalize().unwrap();
            });
        }
    });
}
