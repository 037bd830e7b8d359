//! How the sled store lays its records out in one tree: the prefixes, the keys, and the
//! versioned encodings.

use serde::{Deserialize, Serialize};

use crate::domain::{Account, ClientId, Currency, Fingerprint, Key, MessageId, Timestamp};
use crate::fact::{DecodeError, Outcome};
use crate::store::LedgerError;

pub(super) const P_FACT: u8 = b'f';
pub(super) const P_KEY: u8 = b'k';
pub(super) const P_ACCOUNT: u8 = b'a';
pub(super) const P_REFUNDED: u8 = b'r';
pub(super) const P_INBOX: u8 = b'i';
pub(super) const P_QUARANTINE: u8 = b'q';
pub(super) const STATS_KEY: &[u8] = b"s";
/// A user account's statement: `h account NUL seq` (seq big-endian) → nothing, one entry
/// per movement, written in the batch of its fact. A statement reads its account's entries
/// in order and only their facts, never the whole log.
pub(super) const P_STATEMENT: u8 = b'h';
/// Present once every movement of the log has its statement entry: written when a ledger
/// is created, or at the open that added the entries of a ledger made before statements.
pub(super) const STATEMENTS_READY_KEY: &[u8] = b"v.statements";
/// The last journal group sled holds durably (u64 big-endian), written by each checkpoint
/// once sled's flush of that group returned: recovery replays the journal from the group
/// after it.
pub(super) const GROUP_KEY: &[u8] = b"v.journal";
pub(super) const RECORD_VERSION: u8 = 1;

pub(super) fn fact_key(seq: u64) -> [u8; 9] {
    let mut k = [P_FACT; 9];
    k[1..].copy_from_slice(&seq.to_be_bytes());
    k
}

pub(super) fn quarantine_key(id: u64) -> [u8; 9] {
    let mut k = fact_key(id);
    k[0] = P_QUARANTINE;
    k
}

pub(super) fn scoped_key(prefix: u8, client: &ClientId, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + client.as_str().len() + key.len());
    k.push(prefix);
    k.extend_from_slice(client.as_str().as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

pub(super) fn account_key(account: &Account, currency: Currency) -> Vec<u8> {
    let mut k = Vec::with_capacity(5 + account.as_str().len());
    k.push(P_ACCOUNT);
    k.extend_from_slice(account.as_str().as_bytes());
    k.push(0);
    k.extend_from_slice(currency.as_str().as_bytes());
    k
}

/// `h account NUL`: the prefix of one account's statement entries.
pub(super) fn statement_prefix(account: &Account) -> Vec<u8> {
    let mut k = Vec::with_capacity(11 + account.as_str().len());
    k.push(P_STATEMENT);
    k.extend_from_slice(account.as_str().as_bytes());
    k.push(0);
    k
}

pub(super) fn statement_key(account: &Account, seq: u64) -> Vec<u8> {
    let mut k = statement_prefix(account);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// The account name's bytes and the seq of a statement entry's key.
pub(super) fn split_statement(k: &[u8]) -> Option<(&[u8], u64)> {
    let rest = k.get(1..)?;
    let nul = rest.iter().position(|b| *b == 0)?;
    let seq: [u8; 8] = rest.get(nul + 1..)?.try_into().ok()?;
    Some((&rest[..nul], u64::from_be_bytes(seq)))
}

/// What a key holds once done: where its fact is, and what command it answered.
///
/// The stored answer is the fact itself: `Outcome::from_fact` renders it the same way every
/// time, so a replay is byte-identical without a second copy of the answer (which would
/// cost a third of the bytes per fact and could disagree with the fact). The sweep marks
/// the key expired; the fingerprint stays, so a reuse of an expired key is still refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    pub seq: u64,
    pub at: Timestamp,
    pub fingerprint: Fingerprint,
    pub expired: bool,
}

/// What a done key holds, as a repeat arriving outside the committer finds it.
pub(super) enum Held {
    /// Its durable answer, from the shard's cache.
    Cached(Outcome),
    /// Durable in the log: the answer is its fact's, at this seq.
    Logged(u64),
    /// Applied but not flushed yet: nothing may be answered from it.
    Unflushed,
}

impl KeyRecord {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = vec![RECORD_VERSION];
        out.extend(postcard::to_stdvec(self).unwrap_or_default());
        out
    }
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        match bytes.split_first() {
            Some((&RECORD_VERSION, rest)) => {
                postcard::from_bytes(rest).map_err(|e| DecodeError::new("key record", e))
            }
            _ => Err(DecodeError::new("key record", "unknown version")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxRecord {
    /// The message's fingerprint: its client, key and command (`message_fingerprint`).
    pub fingerprint: Fingerprint,
    /// The fact that answers it.
    pub seq: u64,
}

pub(super) fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    let mut out = vec![RECORD_VERSION];
    out.extend(postcard::to_stdvec(v).unwrap_or_default());
    out
}

pub(super) fn decode<T: for<'de> Deserialize<'de>>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, DecodeError> {
    match bytes.split_first() {
        Some((&RECORD_VERSION, rest)) => {
            postcard::from_bytes(rest).map_err(|e| DecodeError::new(what, e))
        }
        _ => Err(DecodeError::new(what, "unknown version")),
    }
}

pub(super) fn io_err(e: sled::Error) -> LedgerError {
    LedgerError::Unavailable(e.to_string())
}

pub(super) fn seq_of(k: &[u8]) -> Option<u64> {
    let b: [u8; 8] = k.get(1..9)?.try_into().ok()?;
    (k.len() == 9).then(|| u64::from_be_bytes(b))
}

pub(super) fn split_scoped(k: &[u8]) -> Option<(ClientId, Key)> {
    let rest = k.get(1..)?;
    let nul = rest.iter().position(|b| *b == 0)?;
    let client = std::str::from_utf8(&rest[..nul]).ok()?;
    let key = std::str::from_utf8(&rest[nul + 1..]).ok()?;
    Some((ClientId::parse(client).ok()?, Key::parse(key).ok()?))
}

pub(super) fn decode_balance(k: &[u8], v: &[u8]) -> Option<(Account, Currency, i128)> {
    let rest = k.get(1..)?;
    let nul = rest.iter().position(|b| *b == 0)?;
    let account = Account::parse_any(std::str::from_utf8(&rest[..nul]).ok()?).ok()?;
    let currency = Currency::parse(std::str::from_utf8(&rest[nul + 1..]).ok()?).ok()?;
    let balance = i128::from_be_bytes(v.try_into().ok()?);
    Some((account, currency, balance))
}

pub(super) fn inbox_key(message_id: &MessageId) -> Vec<u8> {
    let mut k = vec![P_INBOX];
    k.extend_from_slice(message_id.as_str().as_bytes());
    k
}
