//! Exit codes, the one table (docs/architecture.md §9). The command line exits with them;
//! the worker, the one-shot cell and the Python zygote's children exit with
//! them too, and the supervisor reads them back.

use std::process::ExitCode;

/// How a cellbox process ends. The value is the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Exit {
    /// Success.
    Ok = 0,
    /// The script raised (or: the check run found what it looks for, such
    /// as an escape in the security suite).
    Failed = 1,
    /// A usage or configuration error.
    Usage = 2,
    /// The cell ran past its wall-clock limit.
    Timeout = 3,
    /// A limit was exceeded, or the cell was killed.
    Limit = 4,
    /// The policy denied the cell.
    PolicyDenied = 5,
    /// A sandbox layer could not be applied.
    Sandbox = 6,
    /// An internal or protocol error (the peer is gone or broke the
    /// protocol, a process vanished without a status).
    Internal = 7,
    /// A one-shot cell's child that could not write its own id maps; seen
    /// only by the parent, which then clones the other way.
    NoMaps = 125,
    /// The program a one-shot cell runs could not be executed (as a
    /// shell's).
    NotExecutable = 127,
}

impl Exit {
    /// Every code, in order.
    pub const ALL: [Exit; 10] = [
        Exit::Ok,
        Exit::Failed,
        Exit::Usage,
        Exit::Timeout,
        Exit::Limit,
        Exit::PolicyDenied,
        Exit::Sandbox,
        Exit::Internal,
        Exit::NoMaps,
        Exit::NotExecutable,
    ];

    /// The exit code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The exit code as `std::process::exit` and `_exit` take it.
    pub const fn raw(self) -> i32 {
        self as i32
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codes_are_the_design_table() {
        let codes: Vec<u8> = Exit::ALL.iter().map(|e| e.code()).collect();
        assert_eq!(codes, [0, 1, 2, 3, 4, 5, 6, 7, 125, 127]);
        for e in Exit::ALL {
            assert_eq!(e.raw(), i32::from(e.code()));
        }
    }
}
