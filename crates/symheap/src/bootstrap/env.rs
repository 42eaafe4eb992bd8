//! Who am I: rank, world size and the rendezvous address, read from the launcher's environment.
//!
//! Recognised, in this order: torchrun-style variables (`RANK`, `WORLD_SIZE`, also set by
//! `symheap launch`), Open MPI (`OMPI_COMM_WORLD_*`), MPICH/Hydra (`PMI_RANK`, `PMI_SIZE`) and
//! Slurm job steps (`SLURM_PROCID` under `srun`). None of them set means a single PE.

use super::{auth, secret};
use crate::config::Config;
use crate::error::{invalid, Result};
use crate::util::fnv1a;

/// Which launcher started this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// No launcher variables: a single PE.
    None,
    /// `symheap launch` (torchrun-style variables plus `SYMHEAP_LAUNCHER`).
    Symheap,
    /// torchrun / torch.distributed.elastic.
    Torchrun,
    /// RANK/WORLD_SIZE set by something else.
    TorchStyle,
    /// Open MPI's mpirun.
    OpenMpi,
    /// MPICH / Hydra.
    Pmi,
    /// Slurm's srun.
    Slurm,
}

impl Launcher {
    /// Display name.
    pub fn name(self) -> &'static str {
        match self {
            Launcher::None => "none (single PE)",
            Launcher::Symheap => "symheap launch",
            Launcher::Torchrun => "torchrun",
            Launcher::TorchStyle => "RANK/WORLD_SIZE environment",
            Launcher::OpenMpi => "Open MPI",
            Launcher::Pmi => "MPICH/PMI",
            Launcher::Slurm => "Slurm srun",
        }
    }
}

/// Where a job's token comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `SYMHEAP_TOKEN` (`symheap launch` sets a random one).
    Given,
    /// HMAC of the user's secret file (this path) and the job's public identity: a job across
    /// nodes without `SYMHEAP_TOKEN`.
    UserSecret(std::path::PathBuf),
    /// The job's public identity itself: a job on one node without `SYMHEAP_TOKEN`, whose
    /// rendezvous only this user can reach.
    Derived,
}

impl TokenSource {
    /// A short name of the source, safe to tell a stranger (no path).
    pub fn kind(&self) -> &'static str {
        match self {
            TokenSource::Given => "SYMHEAP_TOKEN",
            TokenSource::UserSecret(_) => "the user secret file",
            TokenSource::Derived => "the launch environment",
        }
    }

    /// False when the token is public job details.
    pub fn is_secret(&self) -> bool {
        !matches!(self, TokenSource::Derived)
    }
}

impl std::fmt::Display for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenSource::Given => write!(f, "SYMHEAP_TOKEN"),
            TokenSource::UserSecret(p) => write!(f, "the user secret file {}", p.display()),
            TokenSource::Derived => write!(f, "derived from the launch environment"),
        }
    }
}

/// The launch environment of this PE.
#[derive(Debug, Clone)]
pub struct LaunchEnv {
    /// Launcher that set the variables.
    pub launcher: Launcher,
    /// This PE's rank.
    pub rank: usize,
    /// Number of PEs.
    pub world: usize,
    /// Rank within the node as the launcher sees it (used to pick a GPU), if it says.
    pub local_rank: Option<usize>,
    /// Host to rendezvous at (rank 0 listens there).
    pub addr: String,
    /// TCP port of the rendezvous.
    pub port: u16,
    /// The job token: every PE proves it holds it at the rendezvous (it never goes on the
    /// wire, see `auth.rs`).
    pub token: Vec<u8>,
    /// Where the token comes from.
    pub token_source: TokenSource,
    /// The launcher says every PE runs on this node (torchrun and `symheap launch`:
    /// `LOCAL_WORLD_SIZE == WORLD_SIZE`; Open MPI: `OMPI_COMM_WORLD_LOCAL_SIZE ==
    /// OMPI_COMM_WORLD_SIZE`; MPICH: `MPI_LOCALNRANKS == PMI_SIZE`; Slurm: one node in the
    /// step). The rendezvous then runs over a Unix socket only this user can reach.
    pub one_node: bool,
}

/// Where launch variables are read from: this process's environment (through [`Config`], which
/// records what was read), or another process's (the twin check, `census.rs`).
pub(crate) trait Vars {
    /// The variable's value, if set.
    fn get(&mut self, name: &str) -> Option<String>;
}

impl Vars for Config {
    fn get(&mut self, name: &str) -> Option<String> {
        self.read(name)
    }
}

impl Vars for std::collections::HashMap<String, String> {
    fn get(&mut self, name: &str) -> Option<String> {
        std::collections::HashMap::get(self, name).cloned()
    }
}

fn var(c: &mut impl Vars, name: &str) -> Option<String> {
    c.get(name).filter(|v| !v.trim().is_empty())
}

fn num(c: &mut impl Vars, name: &str) -> Result<Option<usize>> {
    match var(c, name) {
        None => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|_| {
            invalid(
                "init",
                format!("{name}={v:?} is not accepted: expected a non-negative integer"),
            )
        }),
    }
}

/// The rendezvous port every PE of an MPI / PMI / Slurm job derives from the job identity:
/// 20000 to 31999, below Linux's ephemeral range (32768 up), where any outgoing connection on
/// the node may already hold it (a CI run failed on exactly that with the range up to 49999).
fn derived_port(job_id: &str) -> usize {
    20000 + (fnv1a(job_id.as_bytes()) % 12000) as usize
}

/// Which launcher started this PE, its rank, the world size and its local rank, from the first
/// launcher whose variables are set.
fn launcher_and_rank(cfg: &mut impl Vars) -> Result<(Launcher, usize, usize, Option<usize>)> {
    Ok(
        if let (Some(r), Some(w)) = (num(cfg, "RANK")?, num(cfg, "WORLD_SIZE")?) {
            let l = if var(cfg, "SYMHEAP_LAUNCHER").is_some() {
                Launcher::Symheap
            } else if var(cfg, "TORCHELASTIC_RUN_ID").is_some() {
                Launcher::Torchrun
            } else {
                Launcher::TorchStyle
            };
            (l, r, w, num(cfg, "LOCAL_RANK")?)
        } else if let (Some(r), Some(w)) = (
            num(cfg, "OMPI_COMM_WORLD_RANK")?,
            num(cfg, "OMPI_COMM_WORLD_SIZE")?,
        ) {
            (
                Launcher::OpenMpi,
                r,
                w,
                num(cfg, "OMPI_COMM_WORLD_LOCAL_RANK")?,
            )
        } else if let (Some(r), Some(w)) = (num(cfg, "PMI_RANK")?, num(cfg, "PMI_SIZE")?) {
            (Launcher::Pmi, r, w, num(cfg, "MPI_LOCALRANKID")?)
        } else if var(cfg, "SLURM_STEP_ID").is_some() && var(cfg, "SLURM_PROCID").is_some() {
            // Only inside an srun step: a batch script also has SLURM_PROCID=0 and SLURM_NTASKS,
            // and treating a plain `python x.py` there as rank 0 of N would wait for PEs that
            // never start.
            let r = num(cfg, "SLURM_PROCID")?.unwrap_or(0);
            let w = match num(cfg, "SLURM_STEP_NUM_TASKS")? {
                Some(w) => w,
                None => num(cfg, "SLURM_NTASKS")?.unwrap_or(1),
            };
            (Launcher::Slurm, r, w, num(cfg, "SLURM_LOCALID")?)
        } else {
            (Launcher::None, 0, 1, Some(0))
        },
    )
}

/// How many PEs the launcher says run on this node, if it says.
fn local_size(cfg: &mut impl Vars, launcher: Launcher, world: usize) -> Result<Option<usize>> {
    Ok(match launcher {
        Launcher::Symheap | Launcher::Torchrun | Launcher::TorchStyle => {
            num(cfg, "LOCAL_WORLD_SIZE")?
        }
        Launcher::OpenMpi => num(cfg, "OMPI_COMM_WORLD_LOCAL_SIZE")?,
        Launcher::Pmi => num(cfg, "MPI_LOCALNRANKS")?,
        Launcher::Slurm => match num(cfg, "SLURM_STEP_NUM_NODES")? {
            Some(nodes) => (nodes == 1).then_some(world),
            None => num(cfg, "SLURM_NNODES")?.and_then(|n| (n == 1).then_some(world)),
        },
        Launcher::None => Some(1),
    })
}

/// The launcher's identifier of this job, the same on every PE, where it has one.
fn job_id(cfg: &mut impl Vars, launcher: Launcher) -> Option<String> {
    match launcher {
        // The restart count keeps a straggler of an earlier attempt out of the restarted job.
        Launcher::Torchrun => Some(format!(
            "{}/{}",
            var(cfg, "TORCHELASTIC_RUN_ID").unwrap_or_default(),
            var(cfg, "TORCHELASTIC_RESTART_COUNT").unwrap_or_default()
        )),
        Launcher::OpenMpi => {
            var(cfg, "OMPI_MCA_ess_base_jobid").or_else(|| var(cfg, "PMIX_NAMESPACE"))
        }
        Launcher::Pmi => var(cfg, "PMI_KVSNAME").or_else(|| var(cfg, "PMI_ID")),
        Launcher::Slurm => {
            let job = var(cfg, "SLURM_JOB_ID").unwrap_or_default();
            let step = var(cfg, "SLURM_STEP_ID").unwrap_or_default();
            Some(format!("{job}.{step}"))
        }
        _ => None,
    }
}

/// The host rank 0 listens on: `MASTER_ADDR`, else the step's first node under Slurm, else
/// this machine.
fn rendezvous_addr(cfg: &mut impl Vars, launcher: Launcher) -> String {
    match var(cfg, "MASTER_ADDR") {
        Some(a) => a,
        None => match launcher {
            Launcher::Slurm => var(cfg, "SLURM_STEP_NODELIST")
                .or_else(|| var(cfg, "SLURM_JOB_NODELIST"))
                .and_then(|l| first_host(&l))
                .unwrap_or_else(|| "127.0.0.1".into()),
            _ => "127.0.0.1".into(),
        },
    }
}

/// The rendezvous port: `SYMHEAP_BOOTSTRAP_PORT`, else from `MASTER_PORT`, else derived from
/// the job identity under MPI, PMI and Slurm.
fn rendezvous_port(
    cfg: &mut impl Vars,
    launcher: Launcher,
    world: usize,
    job_id: Option<&str>,
) -> Result<u16> {
    let port_var = if var(cfg, "SYMHEAP_BOOTSTRAP_PORT").is_some() {
        "SYMHEAP_BOOTSTRAP_PORT"
    } else {
        "MASTER_PORT"
    };
    let port = match num(cfg, "SYMHEAP_BOOTSTRAP_PORT")? {
        Some(p) => p,
        None => match (num(cfg, "MASTER_PORT")?, launcher) {
            // torchrun's own store already listens on MASTER_PORT.
            (Some(p), Launcher::Torchrun) => p + 1,
            (Some(p), _) => p,
            (None, _) if world == 1 => 0,
            (None, Launcher::OpenMpi | Launcher::Pmi | Launcher::Slurm) => {
                derived_port(job_id.unwrap_or_default())
            }
            (None, _) => {
                return Err(invalid(
                    "init",
                    format!(
                        "{} started {world} PEs but MASTER_PORT is not set",
                        launcher.name()
                    ),
                ))
            }
        },
    };
    u16::try_from(port).map_err(|_| {
        invalid(
            "init",
            format!(
                "{port_var} gives rendezvous port {port}, which is not accepted: expected a \
                 TCP port, 1 to 65535 (under torchrun symheap uses MASTER_PORT + 1)"
            ),
        )
    })
}

impl LaunchEnv {
    /// The job's public identity, shown in errors: a fingerprint of the token.
    pub fn fingerprint(&self) -> String {
        auth::fingerprint(&self.token)
    }

    /// Reads the environment. Records every variable it used in `cfg.env_read`.
    pub fn detect(cfg: &mut Config) -> Result<LaunchEnv> {
        let l = Launch::read(cfg)?;
        let (token, token_source) = match l.given_token {
            Some(t) => (t.into_bytes(), TokenSource::Given),
            None if l.world > 1 && !l.one_node => {
                let path = secret::secret_path().ok_or_else(|| {
                    crate::error::bootstrap(
                        "init",
                        "a job across nodes without SYMHEAP_TOKEN needs the user secret file, \
                         but neither SYMHEAP_SECRET_FILE, XDG_CONFIG_HOME nor HOME is set; set \
                         SYMHEAP_TOKEN to the same random string on every PE",
                    )
                })?;
                cfg.note("SYMHEAP_SECRET_FILE", &path.display().to_string());
                let key = secret::user_secret(&path)?;
                (
                    auth::derive(&key, l.identity.as_bytes()),
                    TokenSource::UserSecret(path),
                )
            }
            None => (l.identity.into_bytes(), TokenSource::Derived),
        };
        Ok(LaunchEnv {
            launcher: l.launcher,
            rank: l.rank,
            world: l.world,
            local_rank: l.local_rank,
            addr: l.addr,
            port: l.port,
            token,
            token_source,
            one_node: l.one_node,
        })
    }
}

/// What the launch variables say, before any secret is read.
pub(crate) struct Launch {
    pub(crate) launcher: Launcher,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) local_rank: Option<usize>,
    pub(crate) one_node: bool,
    pub(crate) addr: String,
    pub(crate) port: u16,
    /// The job's public identity: launcher, job id, rendezvous and world size.
    pub(crate) identity: String,
    /// `SYMHEAP_TOKEN`, if set.
    pub(crate) given_token: Option<String>,
}

impl Launch {
    pub(crate) fn read(v: &mut impl Vars) -> Result<Launch> {
        let (launcher, rank, world, local_rank) = launcher_and_rank(v)?;
        let one_node = local_size(v, launcher, world)? == Some(world);
        if world == 0 || rank >= world {
            return Err(invalid(
                "init",
                format!("{} says rank {rank} of world size {world}", launcher.name()),
            ));
        }
        if world > u32::MAX as usize / 2 {
            return Err(invalid("init", format!("world size {world} is too large")));
        }
        let job_id = job_id(v, launcher);
        let addr = rendezvous_addr(v, launcher);
        let port = rendezvous_port(v, launcher, world, job_id.as_deref())?;
        let identity = format!(
            "symheap-job:{}:{}:{addr}:{port}:{world}",
            launcher.name(),
            job_id.unwrap_or_default()
        );
        Ok(Launch {
            launcher,
            rank,
            world,
            local_rank,
            one_node,
            addr,
            port,
            identity,
            given_token: var(v, "SYMHEAP_TOKEN"),
        })
    }

    /// What two processes that would be the same PE of the same job share: rank, identity,
    /// token and transport.
    pub(crate) fn twin_key(&self) -> (usize, &str, Option<&str>, bool) {
        (
            self.rank,
            &self.identity,
            self.given_token.as_deref(),
            self.one_node,
        )
    }
}

/// First host name of a Slurm host list such as `gpu[003-007,9],login1`.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let end = list
        .char_indices()
        .scan(0i32, |depth, (i, c)| {
            match c {
                '[' => *depth += 1,
                ']' => *depth -= 1,
                _ => {}
            }
            Some((i, c, *depth))
        })
        .find(|&(_, c, d)| c == ',' && d == 0)
        .map(|(i, _, _)| i)
        .unwrap_or(list.len());
    let first = &list[..end];
    match first.find('[') {
        None => (!first.is_empty()).then(|| first.to_string()),
        Some(open) => {
            let prefix = &first[..open];
            let inner = first[open + 1..].trim_end_matches(']');
            let range = inner.split(',').next()?;
            let lo = range.split('-').next()?;
            Some(format!("{prefix}{lo}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ports_stay_below_the_ephemeral_range() {
        let ports: Vec<usize> = (0..2000)
            .map(|i| derived_port(&format!("job{i}")))
            .collect();
        assert!(ports.iter().all(|p| (20000..32000).contains(p)));
        // The same job always gets the same port, and jobs spread over the range.
        assert_eq!(derived_port("1234@0"), derived_port("1234@0"));
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert!(distinct.len() > 1500, "{} distinct ports", distinct.len());
    }

    fn vars(kv: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_identity_holds_the_launcher_job_id_and_torchrun_restart() {
        let base = [
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ];
        let plain = Launch::read(&mut vars(&base)).unwrap();
        assert_eq!(
            plain.identity,
            "symheap-job:RANK/WORLD_SIZE environment::10.0.0.1:29500:4"
        );
        let tr = |id: &str, restart: &str| {
            let mut v = vars(&base);
            v.insert("TORCHELASTIC_RUN_ID".into(), id.into());
            v.insert("TORCHELASTIC_RESTART_COUNT".into(), restart.into());
            Launch::read(&mut v).unwrap().identity
        };
        // torchrun's rendezvous is MASTER_PORT + 1; a restart is another job.
        assert!(
            tr("abc", "0").ends_with(":abc/0:10.0.0.1:29501:4"),
            "{}",
            tr("abc", "0")
        );
        assert_ne!(tr("abc", "0"), tr("abc", "1"));
        assert_ne!(tr("abc", "0"), tr("xyz", "0"));
        let given = Launch::read(&mut vars(&[
            ("SYMHEAP_TOKEN", "s"),
            base[0],
            base[1],
            base[3],
        ]));
        assert_eq!(given.unwrap().given_token.as_deref(), Some("s"));
    }

    #[test]
    fn slurm_host_lists() {
        assert_eq!(first_host("gpu[003-007,9],login1").unwrap(), "gpu003");
        assert_eq!(first_host("nodeA,nodeB").unwrap(), "nodeA");
        assert_eq!(first_host("single").unwrap(), "single");
        assert_eq!(first_host("n[7]").unwrap(), "n7");
        assert!(first_host("").is_none());
    }
}
