//! Self-test scenarios for teams of any members in any order: splits by a list of ranks
//! (`team_split_ranks`, collective over the parent) and teams made by their members alone
//! (`team_from_world_ranks`, over an all-gather of bytes among the members only: files in a
//! directory every PE of the run learns from PE 0). Every collective is checked against exact
//! references on inputs every PE regenerates from the shared seed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use symheap::{Context, ErrorKind, ReduceOp, SymmetricBuffer, Team};

use super::ops_scenarios::{data, poison, rng};
use super::scenarios::{e2s, Outcome, PeArgs};

/// Elements per block of the collectives.
const COUNT: usize = 37;

/// Buffers for the team collectives, made on every PE before any team (allocation is
/// collective over the world): room for a block from every PE.
pub(super) struct Bufs {
    src: SymmetricBuffer,
    dst: SymmetricBuffer,
}

pub(super) fn bufs(ctx: &Context) -> Result<Bufs, String> {
    let bytes = (ctx.n_pes() * COUNT * 8) as u64;
    Ok(Bufs {
        src: ctx.malloc(bytes).map_err(e2s)?,
        dst: ctx.malloc(bytes).map_err(e2s)?,
    })
}

/// `k` (random, at least 1) distinct values of `0..n` in random order.
fn random_list(r: &mut fastrand::Rng, n: usize) -> Vec<usize> {
    let mut all: Vec<usize> = (0..n).collect();
    r.shuffle(&mut all);
    all.truncate(r.usize(1..=n));
    all
}

/// Membership, ranks and translation of `team`, which must hold the world PEs `members` in
/// that order (INVALID on the other PEs).
fn check_members(ctx: &Context, team: &Team, members: &[usize]) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let world = ctx.world_team();
    let pos = members.iter().position(|&m| m == me);
    ensure!(
        team.is_valid() == pos.is_some(),
        "PE {me}: membership of the team of {members:?}"
    );
    let Some(pos) = pos else {
        ensure!(
            team.n_pes() == 0 && team.my_pe().is_none() && team.members().is_empty(),
            "INVALID reports members"
        );
        ensure!(world.translate_pe(me, team).is_none(), "non-member found");
        return Ok(());
    };
    ensure!(
        team.my_pe() == Some(pos) && team.n_pes() == members.len() && team.members() == members,
        "PE {me}: team PE {:?} of {} ({:?}), expected {pos} of {members:?}",
        team.my_pe(),
        team.n_pes(),
        team.members()
    );
    for (i, &w) in members.iter().enumerate() {
        ensure!(team.world_pe(i) == Some(w), "world_pe({i})");
        ensure!(
            team.translate_pe(i, &world) == Some(w),
            "translate {i} to world"
        );
        ensure!(
            world.translate_pe(w, team) == Some(i),
            "translate {w} from world"
        );
    }
    for w in (0..n).filter(|w| !members.contains(w)) {
        ensure!(world.translate_pe(w, team).is_none(), "PE {w} is no member");
    }
    ensure!(
        team.translate_pe(members.len(), &world).is_none(),
        "translated a member past the end"
    );
    Ok(())
}

/// Every collective on `team` (the world PEs `members`, this PE among them) against exact
/// references: all_reduce (sum, max), all_gather (blocks in team order), broadcast from a
/// random root, alltoall, then a barrier. `tag` varies the data.
pub(super) fn collectives(
    ctx: &Context,
    team: &Team,
    members: &[usize],
    b: &Bufs,
    seed: u64,
    tag: u64,
) -> Outcome {
    let k = members.len();
    let me = team.my_pe().ok_or("not a member")?;
    let mine = ctx.my_pe();
    let input = |pe: usize, t: u64, n: usize| data::<i64>(seed, pe, tag * 16 + t, n);
    let got = |n: usize| -> Result<Vec<i64>, String> {
        let mut v = b.dst.to_vec::<i64>().map_err(e2s)?;
        v.truncate(n);
        Ok(v)
    };
    for (t, op) in [(0, ReduceOp::Sum), (1, ReduceOp::Max)] {
        b.src.write(0, &input(mine, t, COUNT)).map_err(e2s)?;
        poison(&b.dst)?;
        ctx.all_reduce::<i64>(team, &b.dst, &b.src, COUNT, op)
            .map_err(e2s)?;
        let all: Vec<Vec<i64>> = members.iter().map(|&m| input(m, t, COUNT)).collect();
        let want: Vec<i64> = (0..COUNT)
            .map(|i| match op {
                ReduceOp::Sum => all.iter().map(|v| v[i]).sum(),
                _ => all.iter().map(|v| v[i]).max().unwrap(),
            })
            .collect();
        ensure!(got(COUNT)? == want, "all_reduce {op:?} on {members:?}");
    }
    b.src.write(0, &input(mine, 2, COUNT)).map_err(e2s)?;
    poison(&b.dst)?;
    ctx.all_gather::<i64>(team, &b.dst, &b.src, COUNT)
        .map_err(e2s)?;
    let want: Vec<i64> = members.iter().flat_map(|&m| input(m, 2, COUNT)).collect();
    ensure!(
        got(k * COUNT)? == want,
        "all_gather blocks in team order on {members:?}"
    );
    let root = rng(seed, tag, 5).usize(0..k);
    b.src.write(0, &input(mine, 3, COUNT)).map_err(e2s)?;
    poison(&b.dst)?;
    ctx.broadcast::<i64>(team, &b.dst, &b.src, COUNT, root)
        .map_err(e2s)?;
    ensure!(
        got(COUNT)? == input(members[root], 3, COUNT),
        "broadcast from team PE {root} (world PE {}) on {members:?}",
        members[root]
    );
    b.src.write(0, &input(mine, 4, k * COUNT)).map_err(e2s)?;
    poison(&b.dst)?;
    ctx.alltoall::<i64>(team, &b.dst, &b.src, COUNT)
        .map_err(e2s)?;
    let want: Vec<i64> = members
        .iter()
        .flat_map(|&m| input(m, 4, k * COUNT)[me * COUNT..(me + 1) * COUNT].to_vec())
        .collect();
    ensure!(got(k * COUNT)? == want, "alltoall on {members:?}");
    ctx.barrier(team).map_err(e2s)
}

/// Expects `r` to fail with an invalid argument saying `what`.
fn invalid_arg(r: symheap::Result<Team>, what: &str) -> Outcome {
    match r {
        Err(e)
            if matches!(e.kind(), ErrorKind::InvalidArgument(_))
                && e.to_string().contains(what) =>
        {
            Ok(())
        }
        Err(e) => Err(format!("expected an invalid argument saying {what:?}: {e}")),
        Ok(_) => Err(format!("accepted, expected an invalid argument ({what})")),
    }
}

/// Splits of the world by random lists of ranks in random order (the first the world
/// reversed): membership, translation, every collective, a nested split of each by another
/// random list, destroy; bad lists refused; more splits than team slots, destroyed as made.
pub fn teams_any(ctx: &Context, a: PeArgs) -> Outcome {
    let n = ctx.n_pes();
    let world = ctx.world_team();
    let b = bufs(ctx)?;
    // Every PE draws the same lists.
    let mut r = rng(a.seed, 0x7ea, 1);
    for round in 0..4u64 {
        let members = if round == 0 {
            (0..n).rev().collect()
        } else {
            random_list(&mut r, n)
        };
        let team = ctx.team_split_ranks(&world, &members).map_err(e2s)?;
        check_members(ctx, &team, &members)?;
        if team.is_valid() {
            collectives(ctx, &team, &members, &b, a.seed, 2 * round)?;
        }
        let sub = random_list(&mut r, members.len());
        let nested = ctx.team_split_ranks(&team, &sub).map_err(e2s)?;
        let nested_members: Vec<usize> = sub.iter().map(|&i| members[i]).collect();
        check_members(ctx, &nested, &nested_members)?;
        if let Some(me) = nested.my_pe() {
            ensure!(
                nested.translate_pe(me, &team) == Some(sub[me]),
                "nested translate"
            );
            collectives(ctx, &nested, &nested_members, &b, a.seed, 2 * round + 1)?;
        }
        ctx.team_destroy(nested).map_err(e2s)?;
        ctx.team_destroy(team).map_err(e2s)?;
        // Non-members of this round's teams wait for the members here.
        ctx.barrier_all().map_err(e2s)?;
    }
    invalid_arg(ctx.team_split_ranks(&world, &[]), "empty")?;
    invalid_arg(
        ctx.team_split_ranks(&world, &[n]),
        &format!("rank {n} is not a member"),
    )?;
    invalid_arg(
        ctx.team_split_ranks(&world, &[0, 0]),
        "rank 0 appears twice",
    )?;
    ensure!(
        !ctx.team_split_ranks(&Team::INVALID, &[0])
            .map_err(e2s)?
            .is_valid(),
        "split of INVALID"
    );
    // More teams than slots over time: each slot is reused once its team is gone.
    for i in 0..40 {
        let members = random_list(&mut r, n);
        let t = ctx.team_split_ranks(&world, &members).map_err(e2s)?;
        check_members(ctx, &t, &members)?;
        ctx.barrier(&t).map_err(e2s)?;
        ctx.team_destroy(t)
            .map_err(|e| format!("destroy {i}: {e}"))?;
    }
    ctx.barrier_all().map_err(e2s)
}

/// PEs 0..n split the world, the last passing its list reversed: every PE gets the named
/// divergence of the split.
pub fn team_ranks_mismatch(ctx: &Context, _a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let world = ctx.world_team();
    let mut list: Vec<usize> = (0..n).collect();
    if me == n - 1 {
        list.reverse();
    }
    let e = match ctx.team_split_ranks(&world, &list) {
        Ok(_) => return Err("a split with different lists succeeded".into()),
        Err(e) => e,
    };
    println!("got the expected error: {e}");
    ensure!(
        matches!(e.kind(), ErrorKind::CollectiveMismatch(_)),
        "wrong kind: {e}"
    );
    let s = e.to_string();
    let text = |l: &[usize]| {
        let v: Vec<String> = l.iter().map(|r| r.to_string()).collect();
        format!("team_split_ranks(ranks [{}])", v.join(", "))
    };
    let forward: Vec<usize> = (0..n).collect();
    let backward: Vec<usize> = (0..n).rev().collect();
    ensure!(
        s.contains(&text(&forward)) && s.contains(&text(&backward)),
        "both lists should be named: {s}"
    );
    Ok(())
}

/// An all-gather of bytes among exactly the PEs of one list, over files in a directory: each
/// call writes this PE's message as `<group>-<call>-<rank>` and reads the others' in the
/// list's order (a real exchange among the member processes only; the others never see it).
pub(super) struct FileExchange {
    dir: PathBuf,
    group: String,
    me: usize,
    calls: u64,
}

impl FileExchange {
    pub(super) fn new(dir: &Path, group: &str, me: usize) -> FileExchange {
        FileExchange {
            dir: dir.to_path_buf(),
            group: group.to_string(),
            me,
            calls: 0,
        }
    }

    pub(super) fn all_gather(
        &mut self,
        ranks: &[usize],
        mine: &[u8],
    ) -> symheap::Result<Vec<Vec<u8>>> {
        self.calls += 1;
        let fail =
            |why: String| symheap::Error::new(Some(self.me), "exchange", ErrorKind::Bootstrap(why));
        let path = |r: usize| self.dir.join(format!("{}-{}-{r}", self.group, self.calls));
        let tmp = self
            .dir
            .join(format!("{}-{}-{}.tmp", self.group, self.calls, self.me));
        std::fs::write(&tmp, mine)
            .and_then(|()| std::fs::rename(&tmp, path(self.me)))
            .map_err(|e| fail(format!("writing {}: {e}", tmp.display())))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        ranks
            .iter()
            .map(|&r| loop {
                match std::fs::read(path(r)) {
                    Ok(b) => break Ok(b),
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(2))
                    }
                    Err(e) => break Err(fail(format!("PE {r}'s message never came: {e}"))),
                }
            })
            .collect()
    }
}

/// A fresh directory for this run's exchanges, named by PE 0 (a world collective, made by
/// every PE; the exchanges themselves involve the members only). Removed by `done_dir`.
pub(super) fn exchange_dir(ctx: &Context, what: &str) -> Result<PathBuf, String> {
    let mine = if ctx.my_pe() == 0 {
        let nonce = fastrand::u64(..);
        let dir =
            std::env::temp_dir().join(format!("symheap-{what}-{}-{nonce:x}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        dir.to_string_lossy().into_owned().into_bytes()
    } else {
        // Not empty: all_gather_bytes skips the exchange where its payload is empty.
        b"-".to_vec()
    };
    let all = ctx.all_gather_bytes(&mine).map_err(e2s)?;
    Ok(PathBuf::from(String::from_utf8_lossy(&all[0]).into_owned()))
}

/// After a world barrier (nobody reads the directory any more), PE 0 removes it.
pub(super) fn done_dir(ctx: &Context, dir: &Path) -> Outcome {
    ctx.barrier_all().map_err(e2s)?;
    if ctx.my_pe() == 0 {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(())
}

/// Teams made by their members alone: the world cut into two groups in random orders, each
/// made by its members at the same time (the other group never calls); membership,
/// translation, every collective, a nested split; then one group's team made and destroyed
/// more times than there are slots; then teams made until the slots run out (the same count
/// and error on every member); the world's ledger untouched throughout.
pub fn team_from_ranks(ctx: &Context, a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let b = bufs(ctx)?;
    let dir = exchange_dir(ctx, "from-ranks")?;
    let mut r = rng(a.seed, 0x7eb, 1);
    let mut all: Vec<usize> = (0..n).collect();
    r.shuffle(&mut all);
    let cut = r.usize(1..=n);
    let (group, name) = if all[..cut].contains(&me) {
        (all[..cut].to_vec(), "a")
    } else {
        (all[cut..].to_vec(), "b")
    };
    let mut x = FileExchange::new(&dir, name, me);
    let mut exchange = |m: &[u8]| x.all_gather(&group, m);
    let team = ctx
        .team_from_world_ranks(&group, &mut exchange)
        .map_err(e2s)?;
    check_members(ctx, &team, &group)?;
    ensure!(team.to_string().contains("world PEs"), "team name {team}");
    collectives(ctx, &team, &group, &b, a.seed, 100)?;
    // The group's own random draws (the two groups draw differently).
    let mut gr = rng(a.seed, 0x7ec, group[0] as u64);
    let sub = random_list(&mut gr, group.len());
    let nested = ctx.team_split_ranks(&team, &sub).map_err(e2s)?;
    let nested_members: Vec<usize> = sub.iter().map(|&i| group[i]).collect();
    if let Some(i) = nested.my_pe() {
        ensure!(nested.members() == nested_members, "nested members");
        ensure!(
            nested.translate_pe(i, &team) == Some(sub[i]),
            "nested translate"
        );
        collectives(ctx, &nested, &nested_members, &b, a.seed, 101)?;
    } else {
        ensure!(
            !sub.contains(&team.my_pe().unwrap()),
            "left out of the nested team"
        );
    }
    ctx.team_destroy(nested).map_err(e2s)?;
    // Every PE's world ledger is the same: the creations were recorded in none of it.
    ctx.barrier_all().map_err(e2s)?;
    for i in 0..40 {
        let t = ctx
            .team_from_world_ranks(&group, &mut exchange)
            .map_err(|e| format!("team {i}: {e}"))?;
        check_members(ctx, &t, &group)?;
        if i % 8 == 0 {
            collectives(ctx, &t, &group, &b, a.seed, 200 + i)?;
        }
        ctx.team_destroy(t).map_err(e2s)?;
    }
    let mut held = Vec::new();
    let e = loop {
        match ctx.team_from_world_ranks(&group, &mut exchange) {
            Ok(t) => held.push(t),
            Err(e) => break e,
        }
        ensure!(held.len() <= 32, "more teams than slots");
    };
    ensure!(
        matches!(e.kind(), ErrorKind::Unsupported(_))
            && e.to_string().contains("no free team slot"),
        "running out of slots: {e}"
    );
    // The world and `team` hold two of the 32 slots.
    ensure!(
        held.len() == 30,
        "{} teams made before the slots ran out",
        held.len()
    );
    for t in held {
        ctx.team_destroy(t).map_err(e2s)?;
    }
    ctx.team_destroy(team).map_err(e2s)?;
    done_dir(ctx, &dir)
}

/// Errors of a team made by its members alone, every one leaving the context usable: a member
/// passing a differently ordered list (both lists named on every member), lists refused before
/// any exchange, an exchange that fails or returns too few messages; then the team made right.
pub fn team_from_ranks_errors(ctx: &Context, _a: PeArgs) -> Outcome {
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let dir = exchange_dir(ctx, "from-ranks-errors")?;
    let forward: Vec<usize> = (0..n).collect();
    let list = if me == n - 1 {
        forward.iter().rev().copied().collect()
    } else {
        forward.clone()
    };
    let mut x = FileExchange::new(&dir, "all", me);
    let e = match ctx.team_from_world_ranks(&list, &mut |m| x.all_gather(&list, m)) {
        Ok(_) => return Err("members with different lists made a team".into()),
        Err(e) => e,
    };
    println!("got the expected error: {e}");
    let s = e.to_string();
    let text = |l: &[usize]| {
        let v: Vec<String> = l.iter().map(|r| r.to_string()).collect();
        format!("[{}]", v.join(", "))
    };
    let backward: Vec<usize> = forward.iter().rev().copied().collect();
    ensure!(
        matches!(e.kind(), ErrorKind::CollectiveMismatch(_))
            && s.contains(&format!("passed {}", text(&forward)))
            && s.contains(&format!("PE {} passed {}", n - 1, text(&backward))),
        "both lists should be named: {s}"
    );
    let mut never =
        |_: &[u8]| -> symheap::Result<Vec<Vec<u8>>> { panic!("exchange called for a bad list") };
    let bad = |r: symheap::Result<Team>, what: &str| invalid_arg(r, what);
    bad(ctx.team_from_world_ranks(&[], &mut never), "empty")?;
    bad(
        ctx.team_from_world_ranks(&[me, me], &mut never),
        "appears twice",
    )?;
    bad(ctx.team_from_world_ranks(&[n], &mut never), "not a member")?;
    if n > 1 {
        let others: Vec<usize> = (0..n).filter(|&r| r != me).collect();
        bad(
            ctx.team_from_world_ranks(&others, &mut never),
            "is not in the list",
        )?;
    }
    let e = ctx
        .team_from_world_ranks(&[me], &mut |_| {
            Err(symheap::Error::new(
                Some(me),
                "exchange",
                ErrorKind::Bootstrap("store gone".into()),
            ))
        })
        .err()
        .ok_or("a failing exchange made a team")?;
    ensure!(
        e.to_string().contains("store gone"),
        "the exchange's error: {e}"
    );
    bad(
        ctx.team_from_world_ranks(&[me], &mut |_| Ok(Vec::new())),
        "returned 0 messages",
    )?;
    let e = ctx
        .team_from_world_ranks(&[me], &mut |_| Ok(vec![b"junk".to_vec()]))
        .err()
        .ok_or("junk made a team")?;
    ensure!(
        e.to_string().contains("not a member's message"),
        "junk: {e}"
    );
    // Still usable: the right list makes the team.
    let mut x = FileExchange::new(&dir, "again", me);
    let t = ctx
        .team_from_world_ranks(&backward, &mut |m| x.all_gather(&backward, m))
        .map_err(e2s)?;
    check_members(ctx, &t, &backward)?;
    ctx.barrier(&t).map_err(e2s)?;
    ctx.team_destroy(t).map_err(e2s)?;
    done_dir(ctx, &dir)
}

/// PEs 1 and 0 make a team (in that order) by themselves; then PE 0 waits in a barrier of it
/// while every other PE waits in a barrier of the world: a deadlock the watch names on every
/// PE, the team described by its members in team order to the PEs outside it.
pub fn team_from_ranks_deadlock(ctx: &Context, _a: PeArgs) -> Outcome {
    let me = ctx.my_pe();
    let dir = exchange_dir(ctx, "from-ranks-deadlock")?;
    let pair = [1usize, 0];
    let mut team = Team::INVALID;
    if me < 2 {
        let mut x = FileExchange::new(&dir, "pair", me);
        team = ctx
            .team_from_world_ranks(&pair, &mut |m| x.all_gather(&pair, m))
            .map_err(e2s)?;
    }
    let r = if me == 0 {
        ctx.barrier(&team)
    } else {
        ctx.barrier_all()
    };
    if me == 0 {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let e = match r {
        Ok(()) => return Err("a deadlocked barrier returned".into()),
        Err(e) => e,
    };
    println!("got the expected error: {e}");
    let s = e.to_string();
    ensure!(
        matches!(e.kind(), ErrorKind::CollectiveMismatch(_))
            && s.contains("(PEs 1, 0)) for PE 1")
            && s.contains("barrier_all"),
        "the deadlock should name the team by its members in order: {s}"
    );
    Ok(())
}
