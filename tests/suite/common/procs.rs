//! The host's processes as `/proc` shows them: every process, one
//! process's stat line, the tree below a process. Shared by the suite and
//! by `tests/leaks.rs` (which includes this file as a module of its own,
//! so it uses nothing but std).
#![allow(dead_code)]

/// One line of `/proc/<pid>/stat`: the fields the tests look at.
#[derive(Clone, Debug, PartialEq)]
pub struct Stat {
    pub comm: String,
    pub state: char,
    pub ppid: i32,
    /// Start time after boot, in clock ticks (field 22).
    pub start: u64,
}

/// One process: its stat fields and its command line (arguments joined
/// by spaces; empty where it could not be read).
#[derive(Clone, Debug, PartialEq)]
pub struct Proc {
    pub pid: i32,
    pub ppid: i32,
    pub state: char,
    pub start: u64,
    pub cmd: String,
}

/// The pid of every process (the numeric entries of `/proc`).
pub fn pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .collect()
}

/// `/proc/<pid>/stat`, parsed (None once the process is gone).
pub fn stat(pid: i32) -> Option<Stat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let comm = s[open + 1..close].to_owned();
    let rest: Vec<&str> = s.get(close + 2..)?.split_whitespace().collect();
    Some(Stat {
        comm,
        state: rest.first()?.chars().next()?,
        ppid: rest.get(1)?.parse().ok()?,
        start: rest.get(19)?.parse().ok()?,
    })
}

/// The command line of `pid`, arguments joined by spaces ("" if unreadable).
pub fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// The name of `pid` (`/proc/<pid>/comm`; "" if unreadable).
pub fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim_end().to_owned())
        .unwrap_or_default()
}

/// Every process, zombies included.
pub fn processes() -> Vec<Proc> {
    listing(true)
}

/// Every process, zombies included, from its stat line alone (`cmd` left
/// empty): cheaper, for the tests that poll the process tree.
pub fn process_stats() -> Vec<Proc> {
    listing(false)
}

fn listing(with_cmd: bool) -> Vec<Proc> {
    pids()
        .into_iter()
        .filter_map(|pid| {
            let s = stat(pid)?;
            Some(Proc {
                pid,
                ppid: s.ppid,
                state: s.state,
                start: s.start,
                cmd: if with_cmd {
                    cmdline(pid)
                } else {
                    String::new()
                },
            })
        })
        .collect()
}

/// The processes of `all` below `root` (its children, theirs, ...; not
/// `root` itself), nearest first.
pub fn descendants_in(all: &[Proc], root: i32) -> Vec<Proc> {
    let mut found = vec![root];
    let mut out = Vec::new();
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        for p in all {
            if p.ppid == parent && !found.contains(&p.pid) {
                found.push(p.pid);
                out.push(p.clone());
            }
        }
        i += 1;
    }
    out
}

/// The pids below `root` (zombies included), nearest first.
pub fn descendants(root: i32) -> Vec<i32> {
    descendants_in(&process_stats(), root)
        .into_iter()
        .map(|p| p.pid)
        .collect()
}

/// The last word of the `key` line (as "NSpid:") of a process's
/// `/proc/<pid>/status`: for NSpid, its pid in its innermost PID
/// namespace. Empty when the process or the line is gone.
#[allow(dead_code)] // not every test binary that includes this module uses it
pub fn status_field(pid: &str, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().last())
        .unwrap_or_default()
        .to_owned()
}

/// Open fds of this process and what each is ("7 -> pipe:[1234]"), to say
/// which ones a failed count is about.
#[allow(dead_code)] // not every test binary that includes this module uses it
pub fn fd_list() -> Vec<String> {
    let mut fds: Vec<(i32, String)> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let fd: i32 = e.file_name().to_str()?.parse().ok()?;
            let to = std::fs::read_link(e.path()).ok()?;
            Some((fd, to.display().to_string()))
        })
        .collect();
    fds.sort();
    fds.into_iter()
        .map(|(fd, to)| format!("{fd} -> {to}"))
        .collect()
}
