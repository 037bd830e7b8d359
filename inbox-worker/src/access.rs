//! Who may do what: tokens, the tenant each names, and its role. The model
//! (docs/contract.md, "Tenants and access"):
//!
//! - a token names a **tenant** (the client of keys and facts) and a **role**: `submit`
//!   (every command, and the tenant's reads), a list of command kinds (only those, and the
//!   reads), or `read` (the tenant's reads only);
//! - the operator's token (`--admin-token`) reads everything and moves no money;
//! - with no tokens, one tenant, `default`, may do everything, on loopback only.
//!
//! A tenant's accounts live in its own space ([`ledger::tenant`]): nothing it can write
//! names another tenant's account, so isolation does not depend on a check that could be
//! forgotten on one endpoint.

use ledger::{ClientId, Command, Currency};

use crate::wire::CommandKind;

/// The command kinds a `submit` token may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kinds {
    pub deposit: bool,
    pub withdraw: bool,
    pub refund: bool,
}

impl Kinds {
    pub const ALL: Kinds = Kinds {
        deposit: true,
        withdraw: true,
        refund: true,
    };

    pub fn allows(self, kind: CommandKind) -> bool {
        match kind {
            CommandKind::Deposit => self.deposit,
            CommandKind::Withdraw => self.withdraw,
            CommandKind::Refund => self.refund,
        }
    }

    /// `deposit, refund`: what a refusal tells the caller it may send.
    pub fn list(self) -> String {
        let names = [
            (self.deposit, "deposit"),
            (self.withdraw, "withdraw"),
            (self.refund, "refund"),
        ];
        let on: Vec<&str> = names
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| *n)
            .collect();
        on.join(", ")
    }
}

/// What a tenant's token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Send these kinds of commands, and read the tenant's own data.
    Submit(Kinds),
    /// Read the tenant's own data only.
    Read,
}

impl Role {
    /// Whether this role may send `kind`, and if not, the sentence that says why.
    pub fn may_submit(self, kind: CommandKind) -> Result<(), String> {
        match self {
            Role::Submit(kinds) if kinds.allows(kind) => Ok(()),
            Role::Submit(kinds) => Err(format!(
                "this token may send {} commands only",
                kinds.list()
            )),
            Role::Read => Err("this token may only read".to_owned()),
        }
    }
}

/// A tenant's token, as configured.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    pub tenant: ClientId,
    pub role: Role,
    pub secret: String,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret never reaches a log.
        f.debug_struct("Token")
            .field("tenant", &self.tenant)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

impl Token {
    /// A `submit` token for every kind: what `--token NAME=SECRET` has always meant.
    pub fn submit(tenant: ClientId, secret: impl Into<String>) -> Self {
        Self {
            tenant,
            role: Role::Submit(Kinds::ALL),
            secret: secret.into(),
        }
    }

    /// Parses `TENANT[:ROLE]=SECRET`, where ROLE is `submit` (the default), `read`, or
    /// kinds joined by `,` (`deposit`, `withdraw`, `refund`). The error never quotes
    /// the line, which holds a secret.
    pub fn parse(line: &str) -> Result<Token, String> {
        let (who, secret) = line
            .split_once('=')
            .ok_or("expected TENANT=SECRET or TENANT:ROLE=SECRET")?;
        let (tenant, role) = match who.trim().split_once(':') {
            Some((t, r)) => (t, Some(r.trim())),
            None => (who.trim(), None),
        };
        let tenant = ClientId::parse(tenant.trim()).map_err(|e| e.to_string())?;
        let role = match role {
            None | Some("submit") => Role::Submit(Kinds::ALL),
            Some("read") => Role::Read,
            Some(list) => Role::Submit(parse_kinds(list)?),
        };
        let secret = secret.trim();
        if secret.is_empty() {
            return Err("the secret is empty".into());
        }
        Ok(Token {
            tenant,
            role,
            secret: secret.to_owned(),
        })
    }
}

fn parse_kinds(list: &str) -> Result<Kinds, String> {
    let mut kinds = Kinds {
        deposit: false,
        withdraw: false,
        refund: false,
    };
    for kind in list.split(',').map(str::trim) {
        match kind {
            "deposit" => kinds.deposit = true,
            "withdraw" => kinds.withdraw = true,
            "refund" => kinds.refund = true,
            _ => {
                return Err("a role is submit, read, or command kinds joined by ',' \
                     (deposit, withdraw, refund)"
                    .into());
            }
        }
    }
    Ok(kinds)
}

/// Who is calling, once the token is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// A tenant's token, or anyone on a worker without tokens (the tenant `default`
    /// with every right).
    Tenant { tenant: ClientId, role: Role },
    /// The operator's token.
    Operator,
}

/// Compares secrets in time independent of where they differ, with `subtle`, whose
/// comparison the optimiser is kept from turning into an early exit. Only a difference in
/// length answers at once.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq as _;
    a.ct_eq(b).into()
}

/// Why no caller could be named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unknown {
    /// Tokens are configured and none was presented.
    Missing,
    /// A token was presented that is not configured.
    NotAccepted,
}

/// Names the caller of `presented` (a bearer secret, if any).
pub fn resolve(
    tokens: &[Token],
    admin: Option<&str>,
    presented: Option<&[u8]>,
) -> Result<Caller, Unknown> {
    if let (Some(p), Some(admin)) = (presented, admin)
        && same_secret(p, admin.as_bytes())
    {
        return Ok(Caller::Operator);
    }
    if tokens.is_empty() {
        return Ok(Caller::Tenant {
            tenant: ClientId::default_client(),
            role: Role::Submit(Kinds::ALL),
        });
    }
    let presented = presented.ok_or(Unknown::Missing)?;
    // Every token is compared, so the time taken does not tell which one came close.
    let mut found = None;
    for token in tokens {
        if same_secret(presented, token.secret.as_bytes()) {
            found = Some(Caller::Tenant {
                tenant: token.tenant.clone(),
                role: token.role,
            });
        }
    }
    found.ok_or(Unknown::NotAccepted)
}

/// What an inbox's messages may do: which tenant they act for, in which currencies. The
/// broker is the operator's, so a message names its tenant in `client`; a queue that
/// serves one tenant is pinned to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxRules {
    /// The tenant of a message that names none.
    pub default: ClientId,
    /// Whether a message naming another tenant is refused: a queue that serves one tenant.
    pub only: bool,
    /// The currencies commands may name; empty: any ISO 4217 code.
    pub currencies: Vec<Currency>,
}

impl Default for InboxRules {
    fn default() -> Self {
        Self {
            default: ClientId::default_client(),
            only: false,
            currencies: Vec::new(),
        }
    }
}

impl InboxRules {
    /// Pinned to `tenant`: messages that name none act for it, others are refused.
    pub fn only(tenant: ClientId) -> Self {
        Self {
            default: tenant,
            only: true,
            currencies: Vec::new(),
        }
    }

    /// The tenant a message acts for, or `None` when this inbox may not act for the
    /// tenant it names.
    pub fn tenant_of(&self, named: Option<&ClientId>) -> Option<ClientId> {
        match named {
            None => Some(self.default.clone()),
            Some(t) if *t == self.default || !self.only => Some(t.clone()),
            Some(_) => None,
        }
    }
}

/// Whether a worker that accepts `allowed` (empty: every ISO 4217 code) takes
/// `currency`, and if not, the sentence that says why. Checked before the ledger sees a
/// command, because an account's first deposit fixes its currency for ever: a typo
/// (`USS`) must not.
pub fn accepts_currency(allowed: &[Currency], currency: Currency) -> Result<(), String> {
    if !money::is_iso_code(currency.as_str()) {
        return Err("the currency is not an ISO 4217 code".into());
    }
    if allowed.is_empty() || allowed.contains(&currency) {
        return Ok(());
    }
    let list: Vec<&str> = allowed.iter().map(|c| c.as_str()).collect();
    Err(format!("this worker accepts {} only", list.join(", ")))
}

/// The kind of `command`, for the role check of an inbox message.
pub fn kind_of(command: &Command) -> CommandKind {
    match command {
        Command::Deposit { .. } => CommandKind::Deposit,
        Command::Withdraw { .. } => CommandKind::Withdraw,
        Command::Refund { .. } => CommandKind::Refund,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(line: &str) -> Token {
        Token::parse(line).unwrap()
    }

    #[test]
    fn token_lines_name_a_tenant_and_a_role() {
        let t = tok("shop=s3cret");
        assert_eq!(
            (t.tenant.as_str(), t.role),
            ("shop", Role::Submit(Kinds::ALL))
        );
        assert_eq!(tok("shop:submit=x").role, Role::Submit(Kinds::ALL));
        assert_eq!(tok(" shop : read = x ").role, Role::Read);
        assert_eq!(tok("shop : read = x ").secret, "x");
        let checkout = tok("shop:deposit=x").role;
        assert_eq!(checkout.may_submit(CommandKind::Deposit), Ok(()));
        assert_eq!(
            checkout.may_submit(CommandKind::Withdraw),
            Err("this token may send deposit commands only".into())
        );
        let payouts = tok("shop:withdraw,refund=x").role;
        assert!(payouts.may_submit(CommandKind::Deposit).is_err());
        assert!(payouts.may_submit(CommandKind::Refund).is_ok());
        assert_eq!(
            Role::Read.may_submit(CommandKind::Deposit),
            Err("this token may only read".into())
        );
    }

    #[test]
    fn bad_token_lines_are_refused_without_quoting_the_secret() {
        for bad in [
            "shop",
            "shop=",
            "shop:admin=hunter2",
            "shop:deposit,payout=hunter2",
            "sh op=hunter2",
            "=hunter2",
            "a/b=hunter2",
        ] {
            let e = Token::parse(bad).unwrap_err();
            assert!(!e.contains("hunter2"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_missing_token_and_a_wrong_one_are_told_apart() {
        let tokens = [tok("shop=s1"), tok("bank:read=s2")];
        assert_eq!(resolve(&tokens, Some("adm"), None), Err(Unknown::Missing));
        assert_eq!(
            resolve(&tokens, Some("adm"), Some(b"s3")),
            Err(Unknown::NotAccepted)
        );
        assert_eq!(
            resolve(&tokens, Some("adm"), Some(b"adm")),
            Ok(Caller::Operator)
        );
        assert_eq!(
            resolve(&tokens, None, Some(b"s2")),
            Ok(Caller::Tenant {
                tenant: ClientId::parse("bank").unwrap(),
                role: Role::Read
            })
        );
        // No tokens: everyone is the tenant `default`, with every right.
        assert_eq!(
            resolve(&[], None, None),
            Ok(Caller::Tenant {
                tenant: ClientId::default_client(),
                role: Role::Submit(Kinds::ALL)
            })
        );
    }

    #[test]
    fn currencies_are_iso_4217_or_the_operators_list() {
        let c = |s: &str| Currency::parse(s).unwrap();
        assert_eq!(accepts_currency(&[], c("USD")), Ok(()));
        assert_eq!(accepts_currency(&[], c("XAU")), Ok(()));
        assert!(accepts_currency(&[], c("USS")).is_err());
        let only = [c("RUB"), c("EUR")];
        assert_eq!(accepts_currency(&only, c("EUR")), Ok(()));
        assert_eq!(
            accepts_currency(&only, c("USD")),
            Err("this worker accepts RUB, EUR only".into())
        );
    }

    #[test]
    fn an_inbox_pinned_to_a_tenant_refuses_the_others() {
        let shop = ClientId::parse("shop").unwrap();
        let bank = ClientId::parse("bank").unwrap();
        let open = InboxRules::default();
        assert_eq!(open.tenant_of(None), Some(ClientId::default_client()));
        assert_eq!(open.tenant_of(Some(&bank)), Some(bank.clone()));
        let pinned = InboxRules::only(shop.clone());
        assert_eq!(pinned.tenant_of(None), Some(shop.clone()));
        assert_eq!(pinned.tenant_of(Some(&shop)), Some(shop.clone()));
        assert_eq!(pinned.tenant_of(Some(&bank)), None);
    }
}
