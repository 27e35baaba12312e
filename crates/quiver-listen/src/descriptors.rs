//! The process's file descriptor limit.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Raises the soft `RLIMIT_NOFILE` of this process to its hard limit (the
/// soft default is often 1 024, far below what a server may hold) and
/// returns the soft limit in force afterwards. When the limit cannot be
/// read or raised, the current soft limit (or a conservative 1 024) is
/// returned and a warning logged.
pub fn raise_descriptor_limit() -> u64 {
    const FALLBACK: u64 = 1_024;
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(err) => {
            tracing::warn!(error = %err, fallback = FALLBACK, "cannot read the descriptor limit");
            return FALLBACK;
        }
    };
    if soft >= hard {
        return soft;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => hard,
        Err(err) => {
            tracing::warn!(error = %err, soft, hard, "cannot raise the descriptor limit");
            soft
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_limit_reaches_the_hard_limit() {
        let limit = raise_descriptor_limit();
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!((limit, soft), (hard, hard));
    }
}
