//! Connecting to PostgreSQL the way libpq would: `sslmode` with all six of
//! libpq's values and `sslrootcert`, `sslcert` and `sslkey`, written in the
//! URL (or key=value string) exactly as for psql.
//!
//! tokio-postgres' own parser knows only `disable`, `prefer` and `require`
//! and rejects the three file parameters, so they are taken out of the
//! string here, their files read and checked at start-up (a missing file is
//! a configuration error, exit 2, before anything connects), and the rest is
//! handed to `tokio_postgres::Config`. Every connection the program opens —
//! the pool, LISTEN, `migrate`, `check` and the admin commands — goes
//! through [`PgTls::connect`].
//!
//! Differences from libpq, on purpose: the default files under
//! `~/.postgresql/` are not read (a container has no such home; name the
//! files in the URL), and encrypted private keys (`sslpassword`) are not
//! supported.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_postgres::config::SslMode as DriverSslMode;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Connection, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::settings::ConfigError;
use crate::tls::{self, Trust, Which};

/// libpq's `sslmode`, with libpq's meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plain text only.
    Disable,
    /// Plain text first; TLS if the server refuses that.
    Allow,
    /// TLS first; plain text if the server has no TLS or the handshake
    /// fails (the default).
    Prefer,
    /// TLS, the server's certificate not checked (unless `sslrootcert` is
    /// given: then as `verify-ca`).
    Require,
    /// TLS, the certificate chain checked against `sslrootcert`.
    VerifyCa,
    /// TLS, the chain and the host name checked.
    VerifyFull,
}

impl SslMode {
    const NAMES: [(&'static str, SslMode); 6] = [
        ("disable", SslMode::Disable),
        ("allow", SslMode::Allow),
        ("prefer", SslMode::Prefer),
        ("require", SslMode::Require),
        ("verify-ca", SslMode::VerifyCa),
        ("verify-full", SslMode::VerifyFull),
    ];

    fn parse(raw: &str) -> Result<Self, String> {
        Self::NAMES
            .iter()
            .find(|(name, _)| *name == raw)
            .map(|(_, mode)| *mode)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::NAMES.iter().map(|(name, _)| *name).collect();
                format!("'{raw}' is not one of {}", names.join(", "))
            })
    }

    /// The libpq name.
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, mode)| *mode == self)
            .map_or("prefer", |(name, _)| *name)
    }
}

/// The stream of a connection opened by [`PgTls::connect`].
pub type PgStream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;

/// How to secure connections to one PostgreSQL server: the `sslmode` and
/// the TLS configuration its files make.
#[derive(Clone)]
pub struct PgTls {
    mode: SslMode,
    trust: Trust,
    connector: MakeRustlsConnect,
}

impl fmt::Debug for PgTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgTls")
            .field("sslmode", &self.mode.name())
            .field("trust", &self.trust)
            .finish()
    }
}

impl PgTls {
    /// The `sslmode` in force.
    pub fn mode(&self) -> SslMode {
        self.mode
    }

    /// Opens one connection with libpq's fallbacks: `allow` tries plain
    /// text and then TLS, `prefer` tries TLS and then plain text.
    pub async fn connect(
        &self,
        pg: &tokio_postgres::Config,
    ) -> Result<(Client, Connection<Socket, PgStream>), tokio_postgres::Error> {
        match self.mode {
            SslMode::Disable => self.attempt(pg, DriverSslMode::Disable).await,
            SslMode::Allow => match self.attempt(pg, DriverSslMode::Disable).await {
                // The server answered and refused (pg_hba.conf has only
                // hostssl for us, say): libpq then tries again with TLS,
                // and the TLS attempt's failure is the one worth reporting.
                Err(plain) if plain.as_db_error().is_some() => self.attempt(pg, DriverSslMode::Require).await,
                other => other,
            },
            SslMode::Prefer => match self.attempt(pg, DriverSslMode::Prefer).await {
                Err(encrypted) if tls::is_tls_failure(&encrypted) => {
                    // When plain text is refused too, the TLS failure is the
                    // one worth reporting.
                    self.attempt(pg, DriverSslMode::Disable)
                        .await
                        .map_err(|_| encrypted)
                }
                other => other,
            },
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                self.attempt(pg, DriverSslMode::Require).await
            }
        }
    }

    async fn attempt(
        &self,
        pg: &tokio_postgres::Config,
        mode: DriverSslMode,
    ) -> Result<(Client, Connection<Socket, PgStream>), tokio_postgres::Error> {
        let mut pg = pg.clone();
        pg.ssl_mode(mode);
        pg.connect(self.connector.clone()).await
    }
}

/// The parameters this module takes out of a connection string.
#[derive(Debug, Default)]
struct TlsParams {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
    sslcert: Option<String>,
    sslkey: Option<String>,
}

impl TlsParams {
    /// Records `key = value` if it is one of ours; false if it is not.
    fn take(&mut self, key: &str, value: String) -> bool {
        let slot = match key {
            "sslmode" => &mut self.sslmode,
            "sslrootcert" => &mut self.sslrootcert,
            "sslcert" => &mut self.sslcert,
            "sslkey" => &mut self.sslkey,
            _ => return false,
        };
        // As in libpq, a later occurrence wins.
        *slot = Some(value);
        true
    }
}

/// Parses a connection string (URL or key=value) of `variable`: the
/// settings tokio-postgres understands, and the TLS set-up its `ssl*`
/// parameters ask for, with their files read now.
pub fn parse(variable: &'static str, raw: &str) -> Result<(tokio_postgres::Config, PgTls), ConfigError> {
    let error = |problem: String| ConfigError::new(variable, problem);
    let (rest, params) = if is_url(raw) {
        split_url(raw).map_err(error)?
    } else {
        split_key_values(raw).map_err(error)?
    };
    // tokio-postgres' parse errors name the offending part, not the whole
    // string, so they are safe to show.
    let pg: tokio_postgres::Config = rest
        .parse()
        .map_err(|e| error(format!("is not a valid PostgreSQL URL: {e}")))?;
    let tls = tls_from(&params).map_err(error)?;
    Ok((pg, tls))
}

fn is_url(raw: &str) -> bool {
    raw.starts_with("postgres://") || raw.starts_with("postgresql://")
}

/// Takes our parameters out of a URL's query, keeping the others as the
/// user wrote them (their percent-encoding included).
fn split_url(raw: &str) -> Result<(String, TlsParams), String> {
    let mut params = TlsParams::default();
    let Some((base, query)) = raw.split_once('?') else {
        return Ok((raw.to_owned(), params));
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = decode(key).ok_or_else(|| "has a query parameter that is not valid UTF-8".to_owned())?;
        let value = decode(value).ok_or_else(|| format!("{key}: the value is not valid UTF-8"))?;
        if !params.take(&key, value) {
            kept.push(pair);
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, params))
}

fn decode(text: &str) -> Option<String> {
    percent_decode(text.as_bytes())
}

fn percent_decode(bytes: &[u8]) -> Option<String> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied(), bytes.get(i + 2).copied()) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                // Two hex digits make one byte; the digits were just checked.
                out.push((hex(h)? * 16 + hex(l)?) as u8);
                i += 3;
            }
            (byte, _, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Takes our parameters out of a key=value string (`host=db sslmode=…`),
/// keeping the others' text untouched. Follows libpq's (and
/// tokio-postgres') syntax: values may be single-quoted, `\` escapes.
fn split_key_values(raw: &str) -> Result<(String, TlsParams), String> {
    let mut params = TlsParams::default();
    let mut kept = String::new();
    let chars: Vec<(usize, char)> = raw.char_indices().collect();
    let at = |i: usize| chars.get(i).map(|(_, c)| *c);
    let offset = |i: usize| chars.get(i).map_or(raw.len(), |(o, _)| *o);
    let mut i = 0;
    loop {
        while at(i).is_some_and(char::is_whitespace) {
            i += 1;
        }
        if at(i).is_none() {
            break;
        }
        let start = i;
        while at(i).is_some_and(|c| !c.is_whitespace() && c != '=') {
            i += 1;
        }
        let key = &raw[offset(start)..offset(i)];
        while at(i).is_some_and(char::is_whitespace) {
            i += 1;
        }
        if at(i) != Some('=') {
            // Malformed: leave the rest for tokio-postgres to reject with
            // its own message.
            kept.push_str(&raw[offset(start)..]);
            break;
        }
        i += 1;
        while at(i).is_some_and(char::is_whitespace) {
            i += 1;
        }
        let mut value = String::new();
        if at(i) == Some('\'') {
            i += 1;
            loop {
                match at(i) {
                    None => return Err(format!("{key}: unterminated quoted value")),
                    Some('\'') => {
                        i += 1;
                        break;
                    }
                    Some('\\') => {
                        if let Some(c) = at(i + 1) {
                            value.push(c);
                        }
                        i += 2;
                    }
                    Some(c) => {
                        value.push(c);
                        i += 1;
                    }
                }
            }
        } else {
            while let Some(c) = at(i).filter(|c| !c.is_whitespace()) {
                if c == '\\' {
                    if let Some(next) = at(i + 1) {
                        value.push(next);
                    }
                    i += 2;
                } else {
                    value.push(c);
                    i += 1;
                }
            }
        }
        if !params.take(key, value) {
            kept.push_str(&raw[offset(start)..offset(i)]);
            kept.push(' ');
        }
    }
    Ok((kept.trim_end().to_owned(), params))
}

/// The TLS set-up the parameters ask for, as libpq reads them.
fn tls_from(params: &TlsParams) -> Result<PgTls, String> {
    let system = params.sslrootcert.as_deref() == Some("system");
    let mode = match params.sslmode.as_deref() {
        Some(raw) => SslMode::parse(raw).map_err(|e| format!("sslmode: {e}"))?,
        // libpq 16: the system's CAs are meant for public certificates,
        // which only mean something with the host name checked.
        None if system => SslMode::VerifyFull,
        None => SslMode::Prefer,
    };
    if system && mode != SslMode::VerifyFull {
        return Err(format!(
            "sslmode: weak sslmode '{}' may not be used with sslrootcert=system (use verify-full)",
            mode.name()
        ));
    }
    let roots = match params.sslrootcert.as_deref() {
        None => None,
        Some("system") => Some(tls::system_roots().map_err(|e| format!("sslrootcert: {e}"))?),
        Some(path) => {
            Some(tls::read_roots(&file("sslrootcert", path)?).map_err(|e| format!("sslrootcert: {e}"))?)
        }
    };
    let trust = match (mode, roots) {
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
            return Err(format!(
                "sslmode: {} needs sslrootcert: a CA file (PEM), or `system` for the system's CAs",
                mode.name()
            ))
        }
        // libpq checks the chain whenever it has a CA file, in every mode
        // that uses TLS.
        (_, Some(roots)) => Trust::Chain {
            roots: Arc::new(roots),
            check_name: mode == SslMode::VerifyFull,
        },
        (_, None) => Trust::Anything,
    };
    let identity = match (params.sslcert.as_deref(), params.sslkey.as_deref()) {
        (None, None) => None,
        (Some(_), None) => return Err("sslcert: needs sslkey, the file of its private key".to_owned()),
        (None, Some(_)) => {
            return Err("sslkey: needs sslcert, the client certificate it goes with".to_owned())
        }
        (Some(cert), Some(key)) => Some(
            tls::read_identity(&file("sslcert", cert)?, &file("sslkey", key)?).map_err(|(which, e)| {
                match which {
                    Which::Cert => format!("sslcert: {e}"),
                    Which::Key => format!("sslkey: {e}"),
                }
            })?,
        ),
    };
    let config = tls::client_config(&trust, identity.as_ref()).map_err(|e| format!("TLS set-up: {e}"))?;
    Ok(PgTls {
        mode,
        trust,
        connector: MakeRustlsConnect::new(config),
    })
}

fn file(parameter: &str, path: &str) -> Result<PathBuf, String> {
    if path.is_empty() {
        return Err(format!("{parameter}: is empty; give the path of a PEM file"));
    }
    Ok(Path::new(path).to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(raw: &str) -> Result<(tokio_postgres::Config, PgTls), String> {
        parse("OUTBOX_DATABASE_URL", raw).map_err(|e| e.to_string())
    }

    #[test]
    fn every_libpq_sslmode_is_accepted() {
        for (name, mode) in SslMode::NAMES {
            if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) {
                continue;
            }
            let (_, tls) = parsed(&format!("postgres://u@h/db?sslmode={name}")).unwrap();
            assert_eq!(tls.mode(), mode);
        }
        assert_eq!(parsed("postgres://u@h/db").unwrap().1.mode(), SslMode::Prefer);
    }

    #[test]
    fn unknown_sslmodes_name_the_parameter() {
        assert_eq!(
            parsed("postgres://u:secret@h/db?sslmode=sometimes").unwrap_err(),
            "OUTBOX_DATABASE_URL: sslmode: 'sometimes' is not one of disable, allow, prefer, require, verify-ca, verify-full"
        );
    }

    #[test]
    fn missing_files_name_the_parameter_and_the_path() {
        assert_eq!(
            parsed("postgres://u:secret@h/db?sslmode=verify-full&sslrootcert=/x/ca.pem").unwrap_err(),
            "OUTBOX_DATABASE_URL: sslrootcert: cannot read /x/ca.pem: No such file or directory"
        );
        let error = parsed("host=h sslcert=/x/c.pem sslkey=/x/k.pem").unwrap_err();
        assert!(
            error.starts_with("OUTBOX_DATABASE_URL: sslcert: cannot read /x/c.pem"),
            "{error}"
        );
        let error = parsed("postgres://h/db?sslcert=/x/c.pem").unwrap_err();
        assert!(error.contains("sslcert: needs sslkey"), "{error}");
        let error = parsed("postgres://h/db?sslmode=require&sslrootcert=").unwrap_err();
        assert!(error.contains("sslrootcert: is empty"), "{error}");
    }

    #[test]
    fn verification_needs_a_ca() {
        let error = parsed("postgres://h/db?sslmode=verify-ca").unwrap_err();
        assert!(error.contains("sslmode: verify-ca needs sslrootcert"), "{error}");
        let error = parsed("postgres://h/db?sslmode=require&sslrootcert=system").unwrap_err();
        assert!(
            error.contains("may not be used with sslrootcert=system"),
            "{error}"
        );
    }

    #[test]
    fn other_parameters_reach_tokio_postgres() {
        let (pg, tls) =
            parsed("postgres://u@h:6432/db?application_name=x&sslmode=require&connect_timeout=3").unwrap();
        assert_eq!(pg.get_application_name(), Some("x"));
        assert_eq!(pg.get_connect_timeout(), Some(&std::time::Duration::from_secs(3)));
        assert_eq!(tls.mode(), SslMode::Require);
        let (pg, tls) = parsed("host=h port=6432 sslmode='disable' application_name='a b'").unwrap();
        assert_eq!(pg.get_ports(), &[6432]);
        assert_eq!(pg.get_application_name(), Some("a b"));
        assert_eq!(tls.mode(), SslMode::Disable);
    }

    #[test]
    fn percent_encoded_values_are_decoded() {
        let error = parsed("postgres://h/db?sslrootcert=%2Fx%2Fmy%20ca.pem").unwrap_err();
        assert!(error.contains("cannot read /x/my ca.pem"), "{error}");
    }

    #[test]
    fn errors_never_echo_the_password() {
        for raw in [
            "postgres://u:hunter2@h/db?sslmode=bogus",
            "postgres://u:hunter2@h/db?sslrootcert=/x/ca.pem",
            "host=h password=hunter2 sslmode=bogus",
            "postgres://u:hunter2@h:notaport/db",
        ] {
            let error = parsed(raw).unwrap_err();
            assert!(!error.contains("hunter2"), "{error}");
        }
    }
}
