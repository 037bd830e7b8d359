//! The store's `Result`, and sled's errors at open read as what they say of the ledger
//! (damaged, locked, unavailable): below every file that returns them.

use crate::store::LedgerError;

pub(super) type Result<T, E = LedgerError> = std::result::Result<T, E>;

pub(super) fn open_err(path: &str, e: sled::Error) -> LedgerError {
    match e {
        sled::Error::Corruption { .. } => LedgerError::Corrupt {
            path: path.to_owned(),
            detail: format!("sled reports {e}"),
        },
        sled::Error::Io(ref io)
            if io.kind() == std::io::ErrorKind::WouldBlock || io.to_string().contains("lock") =>
        {
            LedgerError::Locked {
                path: path.to_owned(),
            }
        }
        other => LedgerError::Unavailable(format!("opening {path}: {other}")),
    }
}
