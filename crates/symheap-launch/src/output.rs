//! Forwarding the PEs' output: each line of each PE copied whole, with its `[PE r] ` prefix, so
//! that lines of different PEs never mix, and the launcher's own messages.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use symheap::Result;

use crate::backend;

/// Longest piece of output forwarded as one line; a longer line is split so that a PE printing
/// megabytes without a newline cannot make the launcher buffer without bound.
const MAX_LINE: u64 = 1 << 20;

/// Where forwarded output and the launcher's own messages go.
pub(crate) type Sink = Arc<Mutex<dyn Write + Send>>;

/// Writes one whole line under the sink's lock. Failures are ignored: the launcher's own output
/// going away must not stop it from supervising the PEs.
pub(crate) fn say(sink: &Sink, line: &str) {
    let mut w = sink.lock().unwrap_or_else(|p| p.into_inner());
    let _ = writeln!(w, "{line}");
    let _ = w.flush();
}

/// Starts the thread that copies PE `rank`'s output stream `src` to `sink`; `done` is dropped
/// when the stream ends.
pub(crate) fn start_pump(
    rank: usize,
    src: Box<dyn Read + Send>,
    sink: Sink,
    done: Sender<()>,
) -> Result<JoinHandle<()>> {
    let prefix = format!("[PE {rank}] ");
    thread::Builder::new()
        .name(format!("symheap-launch-pe{rank}"))
        .spawn(move || pump(prefix, src, sink, done))
        .map_err(|e| backend("launch", format!("cannot start a thread: {e}")))
}

/// Copies one output stream of one PE to `sink`, a whole line per locked write so that lines of
/// different PEs never mix.
fn pump(prefix: String, src: impl Read, sink: Sink, _done: Sender<()>) {
    let mut reader = BufReader::with_capacity(64 * 1024, src);
    let mut line = Vec::new();
    loop {
        line.clear();
        line.extend_from_slice(prefix.as_bytes());
        match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {
                if line.last() != Some(&b'\n') {
                    line.push(b'\n');
                }
                let mut w = sink.lock().unwrap_or_else(|p| p.into_inner());
                // Keep reading even if writing fails, so the PE never blocks on a full pipe.
                let _ = w.write_all(&line).and_then(|()| w.flush());
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    // Dropping `_done` tells the launcher this stream is finished.
}

/// True once every sender of `rx` is gone, false if `wait` passes first.
pub(crate) fn wait_closed(rx: &Receiver<()>, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Err(RecvTimeoutError::Disconnected) => return true,
            Err(RecvTimeoutError::Timeout) => return false,
            Ok(()) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::launch_with_output;
    use crate::test_util::{run, sh, sinks};

    #[test]
    fn partial_lines_and_raw_bytes_are_forwarded() {
        let mut opts = sh(2, r#"printf 'partial\377line'; printf 'x\ny' >&2"#, 300);
        opts.prefix_output = true;
        let (out, err, o, e) = sinks();
        let outcome = launch_with_output(&opts, o, e).unwrap();
        assert!(outcome.success());
        let out = out.lock().unwrap().clone();
        let err = err.lock().unwrap().clone();
        for r in 0..2 {
            let mut want = format!("[PE {r}] partial").into_bytes();
            want.push(0xff);
            want.extend_from_slice(b"line\n");
            assert!(out.windows(want.len()).any(|w| w == want), "{out:?}");
            let x = format!("[PE {r}] x\n").into_bytes();
            let y = format!("[PE {r}] y\n").into_bytes();
            assert!(err.windows(x.len()).any(|w| w == x), "{err:?}");
            assert!(err.windows(y.len()).any(|w| w == y), "{err:?}");
        }
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 2);
    }

    #[test]
    fn lines_of_different_pes_do_not_mix() {
        let opts = sh(
            4,
            r#"i=0; while [ $i -lt 200 ]; do echo "$RANK-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-$RANK"; i=$((i+1)); done"#,
            300,
        );
        let (outcome, out, _) = run(&opts);
        assert!(outcome.success());
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 800);
        for l in lines {
            let r = &l[4..5];
            assert_eq!(
                l,
                format!("[PE {r}] {r}-{}-{r}", "a".repeat(62)),
                "mixed line"
            );
        }
    }
}
