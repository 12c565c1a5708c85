//! The NATS sink's settings and their validation;
//! [`SinkSettings`](crate::sink::SinkSettings) calls [`NatsConfig::parse`]
//! for `OUTBOX_SINK=nats`.
//!
//! async-nats does not read credentials from a server URL, so they are
//! taken out of the URLs here: a `user:password@` pair, or a lone `token@`
//! (NATS's convention). The server list the client gets carries none, so
//! no log line of the client can show one.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::settings::{var, ConfigError};
use crate::sink::template::RoutingKeyTemplate;
use crate::tls::{self, Trust};

/// How the relay authenticates to the NATS servers.
#[derive(Clone, PartialEq, Eq)]
pub enum NatsAuth {
    /// None given: the server's default account.
    None,
    /// `nats://user:password@host` in the URL.
    UserPassword(String, String),
    /// `nats://token@host` in the URL.
    Token(String),
    /// `OUTBOX_NATS_CREDS_FILE`: a user JWT and its NKey seed (decentralised
    /// auth, NGS / Synadia Cloud).
    CredsFile(PathBuf),
}

impl fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::UserPassword(user, _) => write!(f, "UserPassword({user}, ****)"),
            Self::Token(_) => f.write_str("Token(****)"),
            Self::CredsFile(path) => write!(f, "CredsFile({})", path.display()),
        }
    }
}

/// NATS JetStream sink settings.
#[derive(Clone)]
pub struct NatsConfig {
    /// Server URLs without credentials (`nats://` or `tls://`), tried in
    /// turn; the client also learns the cluster's other servers.
    pub servers: Vec<String>,
    /// Credentials.
    pub auth: NatsAuth,
    /// Subject template; `{event_type}` and `{aggregate_id}` are substituted.
    pub subject: RoutingKeyTemplate,
    /// TLS set-up for `tls://` servers (or when the server requires TLS):
    /// the CA file's roots, or the system's.
    pub tls: Option<NatsTls>,
    /// The servers' `max_control_line` (`OUTBOX_NATS_MAX_CONTROL_LINE`):
    /// a publish whose protocol line would be longer is refused before
    /// sending, since the server would close the connection on it.
    pub max_control_line: usize,
}

/// TLS towards NATS: the CA file it was read from, and the rustls set-up.
#[derive(Clone)]
pub struct NatsTls {
    /// `OUTBOX_NATS_CA_FILE`, if given.
    pub ca_file: Option<String>,
    /// The client configuration (aws-lc-rs, like every TLS of the relay).
    pub config: Arc<rustls::ClientConfig>,
}

impl PartialEq for NatsConfig {
    fn eq(&self, other: &Self) -> bool {
        self.servers == other.servers
            && self.auth == other.auth
            && self.subject == other.subject
            && self.tls.as_ref().map(|t| &t.ca_file) == other.tls.as_ref().map(|t| &t.ca_file)
            && self.max_control_line == other.max_control_line
    }
}

impl Eq for NatsConfig {}

impl fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsConfig")
            .field("servers", &self.servers)
            .field("auth", &self.auth)
            .field("subject", &self.subject)
            .field("ca_file", &self.tls.as_ref().map(|t| &t.ca_file))
            .finish()
    }
}

impl NatsConfig {
    /// Validates `OUTBOX_NATS_URL` (one or more comma-separated URLs),
    /// `OUTBOX_NATS_SUBJECT`, `OUTBOX_NATS_CREDS_FILE` and
    /// `OUTBOX_NATS_CA_FILE`.
    pub fn parse(
        urls: &str,
        subject: &str,
        creds_file: Option<&str>,
        ca_file: Option<&str>,
    ) -> Result<Self, ConfigError> {
        let mut servers = Vec::new();
        let mut auth = NatsAuth::None;
        let mut secure = false;
        for raw in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
            let (server, url_auth, tls) =
                parse_server(raw).map_err(|e| ConfigError::new(var::NATS_URL, e))?;
            secure |= tls;
            if url_auth != NatsAuth::None {
                if auth != NatsAuth::None && auth != url_auth {
                    return Err(ConfigError::new(
                        var::NATS_URL,
                        "the servers carry different credentials; give the same to each (or to one)",
                    ));
                }
                auth = url_auth;
            }
            servers.push(server);
        }
        if servers.is_empty() {
            return Err(ConfigError::new(var::NATS_URL, "names no server"));
        }
        let subject = parse_subject(subject).map_err(|e| ConfigError::new(var::NATS_SUBJECT, e))?;
        if let Some(path) = creds_file {
            if auth != NatsAuth::None {
                return Err(ConfigError::new(
                    var::NATS_CREDS_FILE,
                    format!("is set, and {} carries credentials too; use one", var::NATS_URL),
                ));
            }
            check_creds_file(Path::new(path)).map_err(|e| ConfigError::new(var::NATS_CREDS_FILE, e))?;
            auth = NatsAuth::CredsFile(PathBuf::from(path));
        }
        let tls = match (secure, ca_file) {
            (false, Some(_)) => {
                return Err(ConfigError::new(
                    var::NATS_CA_FILE,
                    format!("is set, but {} names no tls:// server", var::NATS_URL),
                ))
            }
            (false, None) => None,
            (true, _) => Some(tls_config(ca_file)?),
        };
        Ok(Self {
            servers,
            auth,
            subject,
            tls,
            max_control_line: super::message::MAX_CONTROL_LINE,
        })
    }

    /// Sets the servers' `max_control_line` from `OUTBOX_NATS_MAX_CONTROL_LINE`
    /// (bytes; at least 512, as a publish line with a short subject needs
    /// about 100).
    pub fn with_max_control_line(mut self, raw: &str) -> Result<Self, ConfigError> {
        let bytes: usize = raw.trim().parse().map_err(|_| {
            ConfigError::new(
                var::NATS_MAX_CONTROL_LINE,
                format!("'{raw}' is not a number of bytes (the servers' max_control_line, 4096 by default)"),
            )
        })?;
        if bytes < 512 {
            return Err(ConfigError::new(
                var::NATS_MAX_CONTROL_LINE,
                format!("{bytes} is below 512 bytes; give the servers' max_control_line (4096 by default)"),
            ));
        }
        self.max_control_line = bytes;
        Ok(self)
    }

    /// The server list for logs and errors (never carries credentials).
    pub fn describe_servers(&self) -> String {
        self.servers.join(",")
    }
}

/// One server URL: the URL without credentials, the credentials, and
/// whether it asks for TLS.
fn parse_server(raw: &str) -> Result<(String, NatsAuth, bool), String> {
    let mut url = url::Url::parse(raw).map_err(|e| format!("'{}' is not a valid URL: {e}", redact(raw)))?;
    let tls = match url.scheme() {
        "nats" => false,
        "tls" => true,
        other => return Err(format!("scheme '{other}' is not nats or tls")),
    };
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("'{}' names no host", redact(raw)));
    }
    if !matches!(url.path(), "" | "/") || url.query().is_some() {
        return Err(format!(
            "'{}' has a path or query, which NATS does not use",
            redact(raw)
        ));
    }
    let user = decode(url.username())?;
    let auth = match (user.is_empty(), url.password()) {
        (true, None) => NatsAuth::None,
        (false, None) => NatsAuth::Token(user),
        (_, Some(password)) => NatsAuth::UserPassword(user, decode(password)?),
    };
    // Both setters only fail on URLs that cannot have a host, excluded above.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    let mut server = url.to_string();
    if server.ends_with('/') {
        server.pop();
    }
    Ok((server, auth, tls))
}

/// Percent-decodes a URL's user or password (not form decoding: a `+` in
/// a password stays a `+`).
fn decode(part: &str) -> Result<String, String> {
    let bytes = part.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = part
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or("credentials in the URL have a malformed %-escape")?;
            decoded.push(hex);
            i += 3;
        } else {
            decoded.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(decoded).map_err(|_| "credentials in the URL are not UTF-8 once decoded".to_owned())
}

/// The URL with its credentials masked, for errors.
fn redact(raw: &str) -> String {
    match raw.rfind('@') {
        Some(at) => match raw.find("://") {
            Some(scheme) if scheme < at => format!("{}****{}", &raw[..scheme + 3], &raw[at..]),
            _ => format!("****{}", &raw[at..]),
        },
        None => raw.to_owned(),
    }
}

/// A subject template. Tokens are separated by `.`; literal parts must not
/// hold wildcards (`*`, `>`) or white space, which no published subject may
/// contain. What the placeholders bring is checked per event.
///
/// The first token must be literal, and not one of the server's own
/// namespaces: otherwise an `event_type` written by a producer could
/// address the JetStream API (`$JS.API.STREAM.DELETE.…`), the system
/// account (`$SYS`), a KV bucket or object store (`$KV`, `$O`) or another
/// client's request inbox (`_INBOX.…`), with the relay's permissions.
fn parse_subject(raw: &str) -> Result<RoutingKeyTemplate, String> {
    let template = RoutingKeyTemplate::parse(raw.trim())?;
    let literal = template.render("x", "x");
    check_subject(&literal).map_err(|e| format!("'{raw}' {e}"))?;
    let marked = template.render("\u{1}", "\u{1}");
    let first = marked.split('.').next().unwrap_or_default();
    if first.contains('\u{1}') {
        return Err(format!(
            "'{raw}' must start with a literal token (e.g. outbox.{{event_type}}), \
             so that no event can choose the subject's namespace"
        ));
    }
    if let Some(reserved) = reserved_namespace(first) {
        return Err(format!(
            "'{raw}' starts with '{first}', {reserved}; the relay publishes only to application subjects"
        ));
    }
    Ok(template)
}

/// What the first token `first` of a subject addresses, when it is one of
/// the server's namespaces rather than the application's.
fn reserved_namespace(first: &str) -> Option<&'static str> {
    if first.starts_with('$') {
        // $JS, $JSC, $KV, $O, $SYS, $G, $NRG, $MQTT and those to come.
        Some("a NATS system namespace ('$…')")
    } else if first.starts_with("_INBOX") {
        Some("the namespace of request inboxes ('_INBOX')")
    } else if matches!(first, "_R_" | "_GR_") {
        Some("a namespace of the server's routed replies")
    } else {
        None
    }
}

/// Whether `subject` can be published to: non-empty tokens, no wildcard
/// token, no white space or control characters. async-nats checks less
/// (empty, white space), and so does the server outside pedantic mode; but
/// a wildcard or empty token would never reach a stream as meant.
pub(super) fn check_subject(subject: &str) -> Result<(), String> {
    if subject.is_empty() {
        return Err("is an empty subject".to_owned());
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("contains white space or a control character, which a NATS subject cannot".to_owned());
    }
    for token in subject.split('.') {
        if token.is_empty() {
            return Err("has an empty token (a leading, trailing or doubled '.')".to_owned());
        }
        if token == "*" || token == ">" {
            return Err(format!(
                "has the wildcard token '{token}', which cannot be published to"
            ));
        }
    }
    Ok(())
}

/// A creds file holds a user JWT and an NKey seed between BEGIN/END lines;
/// checked here so that a wrong path fails at start-up, naming the
/// variable, not at every connection attempt.
fn check_creds_file(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {}", path.display(), tls::io_reason(&e)))?;
    let has = |what: &str| text.contains(&format!("-----BEGIN {what}"));
    if !has("NATS USER JWT") || !has("USER NKEY SEED") {
        return Err(format!(
            "{} is not a NATS credentials file (a user JWT and an NKey seed)",
            path.display()
        ));
    }
    Ok(())
}

fn tls_config(ca_file: Option<&str>) -> Result<NatsTls, ConfigError> {
    let roots = match ca_file {
        Some(path) => tls::read_roots(Path::new(path)),
        None => tls::system_roots(),
    }
    .map_err(|e| ConfigError::new(var::NATS_CA_FILE, e.0))?;
    let trust = Trust::Chain {
        roots: Arc::new(roots),
        check_name: true,
    };
    let config = tls::client_config(&trust, None)
        .map_err(|e| ConfigError::new(var::NATS_URL, format!("TLS set-up: {e}")))?;
    Ok(NatsTls {
        ca_file: ca_file.map(str::to_owned),
        config: Arc::new(config),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<NatsConfig, ConfigError> {
        NatsConfig::parse(url, "outbox.{event_type}", None, None)
    }

    #[test]
    fn several_servers_without_their_credentials() {
        let config = parse("nats://alice:s%40c+ret@n1:4222, nats://n2:4222").unwrap();
        assert_eq!(config.servers, ["nats://n1:4222", "nats://n2:4222"]);
        assert_eq!(
            config.auth,
            NatsAuth::UserPassword("alice".into(), "s@c+ret".into())
        );
        let config = parse("nats://t0k3n@localhost:4222").unwrap();
        assert_eq!(config.auth, NatsAuth::Token("t0k3n".into()));
        assert_eq!(config.servers, ["nats://localhost:4222"]);
        assert_eq!(parse("nats://localhost").unwrap().auth, NatsAuth::None);
    }

    #[test]
    fn secrets_appear_in_no_error_and_no_debug_output() {
        let config = parse("nats://alice:hunter2@n1:4222").unwrap();
        assert!(!format!("{config:?}").contains("hunter2"));
        let token = parse("nats://hunter2@n1:4222").unwrap();
        assert!(!format!("{token:?}").contains("hunter2"));
        for bad in [
            "http://alice:hunter2@n1",
            "nats://alice:hunter2@n1/path",
            "nats://alice:hunter2@",
            "nats://a:b@n1,nats://c:hunter2@n2",
        ] {
            let error = parse(bad).unwrap_err();
            assert_eq!(error.variable, "OUTBOX_NATS_URL", "{bad}");
            assert!(!error.to_string().contains("hunter2"), "{error}");
        }
    }

    #[test]
    fn subjects_must_be_publishable() {
        for bad in [
            "",
            "outbox.>",
            "outbox.*.{event_type}",
            "a..{event_type}",
            "a b",
            "{nope}",
            ".{event_type}",
        ] {
            let error = NatsConfig::parse("nats://n1", bad, None, None).unwrap_err();
            assert_eq!(error.variable, "OUTBOX_NATS_SUBJECT", "{bad}");
        }
        let config =
            NatsConfig::parse("nats://n1", "events.{aggregate_id}.{event_type}", None, None).unwrap();
        assert_eq!(config.subject.render("order.paid", "7"), "events.7.order.paid");
        assert!(check_subject("events. x").is_err());
        assert!(check_subject("events.*").is_err());
        assert!(check_subject("events.order.paid").is_ok());
    }

    #[test]
    fn a_subject_starts_with_a_literal_application_token() {
        for (bad, says) in [
            ("{event_type}", "must start with a literal token"),
            ("{aggregate_id}.x", "must start with a literal token"),
            ("t-{event_type}.x", "must start with a literal token"),
            ("$JS.{event_type}", "system namespace"),
            ("$SYS.x.{event_type}", "system namespace"),
            ("$KV.bucket.{aggregate_id}", "system namespace"),
            ("$O.x", "system namespace"),
            ("_INBOX.{event_type}", "request inboxes"),
            ("_INBOX_custom.{event_type}", "request inboxes"),
            ("_R_.{event_type}", "routed replies"),
        ] {
            let error = NatsConfig::parse("nats://n1", bad, None, None).unwrap_err();
            assert_eq!(error.variable, "OUTBOX_NATS_SUBJECT", "{bad}");
            assert!(error.problem.contains(says), "{bad}: {error}");
        }
        for good in [
            "outbox.{event_type}",
            "orders.{aggregate_id}.{event_type}",
            "fixed",
            "app.$JS.{event_type}",
            "inbox.{event_type}",
        ] {
            assert!(NatsConfig::parse("nats://n1", good, None, None).is_ok(), "{good}");
        }
    }

    #[test]
    fn files_name_their_variable() {
        let error = NatsConfig::parse("nats://n1", "s", Some("/no/such.creds"), None).unwrap_err();
        assert_eq!(
            error.to_string(),
            "OUTBOX_NATS_CREDS_FILE: cannot read /no/such.creds: No such file or directory"
        );
        let error = NatsConfig::parse("nats://u:p@n1", "s", Some("/no/such.creds"), None).unwrap_err();
        assert_eq!(error.variable, "OUTBOX_NATS_CREDS_FILE");
        let error = NatsConfig::parse("nats://n1", "s", None, Some("/x/ca.pem")).unwrap_err();
        assert_eq!(error.variable, "OUTBOX_NATS_CA_FILE");
        let error = NatsConfig::parse("tls://n1", "s", None, Some("/x/ca.pem")).unwrap_err();
        assert_eq!(error.variable, "OUTBOX_NATS_CA_FILE");
        assert!(NatsConfig::parse("tls://n1", "s", None, None)
            .unwrap()
            .tls
            .is_some());
    }

    #[test]
    fn a_creds_file_must_hold_a_jwt_and_a_seed() {
        let dir = std::env::temp_dir().join(format!("nats-creds-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.creds");
        std::fs::write(&bad, "not a creds file").unwrap();
        let error = NatsConfig::parse("nats://n1", "s", bad.to_str(), None).unwrap_err();
        assert!(error.problem.contains("not a NATS credentials file"), "{error}");
        let good = dir.join("good.creds");
        std::fs::write(
            &good,
            "-----BEGIN NATS USER JWT-----\neyJ0\n------END NATS USER JWT------\n\n\
             -----BEGIN USER NKEY SEED-----\nSUAM\n------END USER NKEY SEED------\n",
        )
        .unwrap();
        let config = NatsConfig::parse("nats://n1", "s", good.to_str(), None).unwrap();
        assert_eq!(config.auth, NatsAuth::CredsFile(good.clone()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
