//! PgStore's balances as stored: the user accounts' rows and the system accounts' shards
//! summed, read by `Store::balances` and checked against the log by `verify`.

use super::db::{Result, get, pg_err};
use super::state::PgStore;
use crate::domain::Account;
use crate::projection::Balances;

/// Every balance as stored: user rows, and system accounts with their shards summed.
pub(super) const SQL_BALANCES: &str = "SELECT account, currency, balance::text FROM accounts \
     UNION ALL \
     SELECT account, currency, sum(balance)::text FROM system_balances \
     GROUP BY account, currency";

impl PgStore {
    pub(super) async fn all_balances(&self) -> Result<Balances> {
        let conn = self.conn().await?;
        let rows = conn
            .query(SQL_BALANCES, &[])
            .await
            .map_err(|e| pg_err(&e))?;
        let mut balances = Balances::default();
        for row in rows {
            let name: String = get(&row, 0)?;
            let account = Account::parse_any(&name)
                .map_err(|_| self.corrupt(format!("a stored account name {name:?}")))?;
            let currency = self.currency(get(&row, 1)?)?;
            let balance = self.signed(get(&row, 2)?)?;
            balances
                .accounts
                .entry(account)
                .or_default()
                .insert(currency, balance);
        }
        Ok(balances)
    }
}
