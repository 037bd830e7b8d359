//! Tenants: who owns which accounts. A tenant is the client of keys and facts
//! ([`ClientId`]): its keys are scoped by it, and so are its accounts. A tenant names its
//! accounts as it likes (`alice`); the ledger records them under a ledger-wide name,
//! `shop/alice`, so that two tenants' `alice` are two accounts and no name a tenant can
//! write reaches another tenant's money: `/` is not a character of an account's name,
//! and every name a tenant gives is taken inside its own space.
//!
//! The tenant `default` (the one client of a worker without tokens) keeps its names as
//! written, so a ledger served without tokens reads the same before and after tenants.
//! System accounts (`@world`, `@payouts`) are ledger-wide: they take the other leg of
//! every tenant's movements.
//!
//! The stores speak ledger-wide names; the worker maps at its edge, inward with
//! [`Command::for_tenant`] and outward with the `seen_by` functions, so every answer a
//! tenant reads uses its own names.

use crate::domain::{Account, ClientId, Command};
use crate::fact::{Fact, FactBody, Outcome};

/// Between a tenant's name and its account's name in a ledger-wide account name.
pub const SEPARATOR: char = '/';

/// Whether `tenant` names its accounts as written (the tenant `default`).
fn unscoped(tenant: &ClientId) -> bool {
    tenant.as_str() == ClientId::default_client().as_str()
}

/// The ledger-wide name of `tenant`'s account `name`; `None` for `default/…`, which is
/// not a name: the tenant `default` has no prefix.
pub(crate) fn owned_name(tenant: &ClientId, name: &Account) -> Option<Account> {
    (!unscoped(tenant) && !name.is_system())
        .then(|| Account::from_checked(format!("{tenant}{SEPARATOR}{name}", name = name.as_str())))
}

/// The ledger-wide name of the account `tenant` calls `name`. System accounts and the
/// tenant `default`'s names are ledger-wide already.
pub fn scoped(tenant: &ClientId, name: &Account) -> Account {
    owned_name(tenant, name).unwrap_or_else(|| name.clone())
}

/// The tenant whose account `account` is: the prefix of a scoped name, `default` for an
/// unscoped user account, `None` for a system account.
pub fn owner(account: &Account) -> Option<ClientId> {
    if account.is_system() {
        return None;
    }
    match account.as_str().split_once(SEPARATOR) {
        Some((tenant, _)) => ClientId::parse(tenant).ok(),
        None => Some(ClientId::default_client()),
    }
}

/// `account` as `tenant` names it: its own accounts without the prefix, system accounts
/// as they are. `None` for another tenant's account.
pub fn seen_by(tenant: &ClientId, account: &Account) -> Option<Account> {
    if account.is_system() {
        return Some(account.clone());
    }
    match account.as_str().split_once(SEPARATOR) {
        Some((owner, name)) if owner == tenant.as_str() => Account::parse(name).ok(),
        Some(_) => None,
        None => unscoped(tenant).then(|| account.clone()),
    }
}

/// `account` as `tenant` sees it; a name that is not the tenant's stays ledger-wide (a
/// fact never names another tenant's account, so this is for the impossible case only).
fn relative(tenant: &ClientId, account: &Account) -> Account {
    seen_by(tenant, account).unwrap_or_else(|| account.clone())
}

impl Command {
    /// The command with its account taken inside `tenant`'s space: what the store
    /// records for a command `tenant` sent.
    pub fn for_tenant(&self, tenant: &ClientId) -> Command {
        self.map_account(|a| scoped(tenant, a))
    }

    /// The command as `tenant` wrote it.
    pub fn seen_by(&self, tenant: &ClientId) -> Command {
        self.map_account(|a| relative(tenant, a))
    }

    fn map_account(&self, f: impl Fn(&Account) -> Account) -> Command {
        match self {
            Command::Deposit {
                account,
                amount,
                currency,
            } => Command::Deposit {
                account: f(account),
                amount: *amount,
                currency: *currency,
            },
            Command::Withdraw {
                account,
                amount,
                currency,
            } => Command::Withdraw {
                account: f(account),
                amount: *amount,
                currency: *currency,
            },
            Command::Refund { .. } => self.clone(),
        }
    }
}

impl Outcome {
    /// The outcome as `tenant`, who sent its command, reads it.
    pub fn seen_by(&self, tenant: &ClientId) -> Outcome {
        match self {
            Outcome::Applied(r) => {
                let mut r = r.clone();
                r.command = r.command.seen_by(tenant);
                r.account = relative(tenant, &r.account);
                Outcome::Applied(r)
            }
            Outcome::Rejected(r) => {
                let mut r = r.clone();
                r.command = r.command.seen_by(tenant);
                Outcome::Rejected(r)
            }
        }
    }
}

impl Fact {
    /// The fact as its own tenant (its client) reads it.
    pub fn seen_by_owner(&self) -> Fact {
        let tenant = &self.client;
        let body = match &self.body {
            FactBody::DepositRecorded {
                account,
                amount,
                currency,
                balance_after,
            } => FactBody::DepositRecorded {
                account: relative(tenant, account),
                amount: *amount,
                currency: *currency,
                balance_after: *balance_after,
            },
            FactBody::WithdrawalRecorded {
                account,
                amount,
                currency,
                balance_after,
            } => FactBody::WithdrawalRecorded {
                account: relative(tenant, account),
                amount: *amount,
                currency: *currency,
                balance_after: *balance_after,
            },
            FactBody::RefundRecorded {
                withdrawal,
                account,
                amount,
                currency,
                balance_after,
                refunded_total,
            } => FactBody::RefundRecorded {
                withdrawal: withdrawal.clone(),
                account: relative(tenant, account),
                amount: *amount,
                currency: *currency,
                balance_after: *balance_after,
                refunded_total: *refunded_total,
            },
            FactBody::CommandRejected {
                command,
                rejection,
                detail,
            } => FactBody::CommandRejected {
                command: command.seen_by(tenant),
                rejection: *rejection,
                detail: *detail,
            },
        };
        Fact {
            body,
            ..self.clone()
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn t(s: &str) -> ClientId {
        ClientId::parse(s).unwrap()
    }
    fn a(s: &str) -> Account {
        Account::parse_any(s).unwrap()
    }

    #[test]
    fn a_tenant_names_only_its_own_accounts() {
        let check = |tenant: &str, name: &str, ledger_wide: &str| {
            let got = scoped(&t(tenant), &a(name));
            assert_eq!(got.as_str(), ledger_wide, "{tenant} {name}");
            assert_eq!(seen_by(&t(tenant), &got), Some(a(name)), "{tenant} {name}");
            assert_eq!(Account::parse_any(ledger_wide).unwrap(), got);
        };
        check("shop", "alice", "shop/alice");
        check("other", "alice", "other/alice");
        check("shop", "a.b:c", "shop/a.b:c");
        check("default", "alice", "alice");
        check("shop", "@world", "@world");
        check("default", "@payouts", "@payouts");
    }

    #[test]
    fn another_tenants_account_is_not_seen() {
        let shop_alice = scoped(&t("shop"), &a("alice"));
        assert_eq!(seen_by(&t("other"), &shop_alice), None);
        assert_eq!(seen_by(&t("default"), &shop_alice), None);
        // `default`'s unscoped accounts are no other tenant's.
        assert_eq!(seen_by(&t("shop"), &a("alice")), None);
        assert_eq!(owner(&shop_alice), Some(t("shop")));
        assert_eq!(owner(&a("alice")), Some(t("default")));
        assert_eq!(owner(&a("@world")), None);
    }

    #[test]
    fn ledger_wide_names_that_cannot_exist_are_refused() {
        for bad in [
            "default/alice",
            "shop/@world",
            "shop/",
            "/alice",
            "a:b/alice",
            "shop/x/y",
        ] {
            assert!(Account::parse_any(bad).is_err(), "{bad}");
        }
        // A tenant cannot write a ledger-wide name.
        assert!(Account::parse("shop/alice").is_err());
    }

    #[test]
    fn commands_and_outcomes_map_both_ways() {
        let shop = t("shop");
        let sent = Command::Withdraw {
            account: a("alice"),
            amount: crate::Amount::new(5).unwrap(),
            currency: crate::Currency::parse("RUB").unwrap(),
        };
        let recorded = sent.for_tenant(&shop);
        assert_ne!(recorded, sent);
        assert_eq!(recorded.seen_by(&shop), sent);
        let refund = Command::Refund {
            withdrawal: crate::Key::parse("w1").unwrap(),
            amount: crate::Amount::new(5).unwrap(),
        };
        assert_eq!(refund.for_tenant(&shop), refund);
    }
}
