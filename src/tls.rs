//! TLS for every connection the relay opens, PostgreSQL, RabbitMQ and NATS alike:
//! one stack (rustls with the aws-lc-rs provider), certificate files read
//! and checked at start-up, and failures put in words an operator can act
//! on ("unknown CA", "expired", "name mismatch") instead of rustls' enum
//! names.
//!
//! Three levels of trust cover libpq's `sslmode`s and AMQPS:
//! - [`Trust::Anything`]: encrypted, not authenticated (`require` without a
//!   CA, `prefer`, `allow`);
//! - [`Trust::Chain`] with `check_name: false`: the chain must end at a
//!   trusted CA, any host name (`verify-ca`);
//! - [`Trust::Chain`] with `check_name: true`: both (`verify-full`, AMQPS).

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{
    AlertDescription, CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// The one crypto provider of the process. Passed explicitly rather than
/// installed as the process default, so nothing depends on which library
/// happened to build a TLS configuration first.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Which server certificates a connection accepts.
#[derive(Clone)]
pub enum Trust {
    /// Any certificate: the connection is encrypted but the server is not
    /// authenticated.
    Anything,
    /// A chain ending at one of `roots`; with `check_name`, also issued for
    /// the host name connected to.
    Chain {
        /// The CAs trusted.
        roots: Arc<RootCertStore>,
        /// Whether the certificate must name the host.
        check_name: bool,
    },
}

impl fmt::Debug for Trust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trust::Anything => f.write_str("Anything"),
            Trust::Chain { roots, check_name } => f
                .debug_struct("Chain")
                .field("roots", &roots.len())
                .field("check_name", check_name)
                .finish(),
        }
    }
}

/// A client certificate chain and its private key (mutual TLS).
pub struct Identity {
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("Identity")
            .field("certs", &self.certs.len())
            .finish()
    }
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Self {
            certs: self.certs.clone(),
            key: self.key.clone_key(),
        }
    }
}

/// Why a certificate file cannot be used; names the file, never its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError(pub String);

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, FileError> {
    std::fs::read(path).map_err(|e| FileError(format!("cannot read {}: {}", path.display(), io_reason(&e))))
}

/// "No such file or directory", without the "(os error 2)" tail.
pub(crate) fn io_reason(error: &io::Error) -> String {
    let text = error.to_string();
    match text.find(" (os error") {
        Some(end) => text[..end].to_owned(),
        None => text,
    }
}

/// The PEM certificates of a file (a CA bundle or a client chain).
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, FileError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| FileError(format!("{} is not a PEM certificate file: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(FileError(format!(
            "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        )));
    }
    Ok(certs)
}

/// The CAs of a PEM bundle; every certificate in it must be usable.
pub fn read_roots(path: &Path) -> Result<RootCertStore, FileError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certificates(path)? {
        roots.add(cert).map_err(|e| {
            FileError(format!(
                "{} holds a certificate that cannot be a CA: {e}",
                path.display()
            ))
        })?;
    }
    Ok(roots)
}

/// The operating system's trusted CAs (what `sslrootcert=system` and an
/// AMQPS broker without a CA file are checked against).
pub fn system_roots() -> Result<RootCertStore, FileError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (_, _ignored) = roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        let why = found.errors.first().map(|e| format!(": {e}")).unwrap_or_default();
        return Err(FileError(format!(
            "no system CA certificates found (install ca-certificates, or set SSL_CERT_FILE){why}"
        )));
    }
    Ok(roots)
}

/// A client certificate (PEM chain, the client's own first) and its
/// unencrypted PEM private key (PKCS#8, PKCS#1 or SEC1).
pub fn read_identity(cert_path: &Path, key_path: &Path) -> Result<Identity, (Which, FileError)> {
    let certs = read_certificates(cert_path).map_err(|e| (Which::Cert, e))?;
    let pem = read(key_path).map_err(|e| (Which::Key, e))?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        let hint = if String::from_utf8_lossy(&pem).contains("ENCRYPTED") {
            " (encrypted keys are not supported: decrypt it, e.g. with openssl pkey)"
        } else {
            ""
        };
        (
            Which::Key,
            FileError(format!(
                "{} is not a PEM private key: {e}{hint}",
                key_path.display()
            )),
        )
    })?;
    let identity = Identity { certs, key };
    // Building a configuration checks that the key belongs to the certificate.
    client_config(&Trust::Anything, Some(&identity)).map_err(|e| {
        (
            Which::Key,
            FileError(format!(
                "{} does not go with the certificate {}: {e}",
                key_path.display(),
                cert_path.display()
            )),
        )
    })?;
    Ok(identity)
}

/// Which file of an identity a [`read_identity`] error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The certificate file.
    Cert,
    /// The private key file.
    Key,
}

/// A rustls client configuration for `trust`, presenting `identity` when
/// the server asks for a client certificate.
pub fn client_config(trust: &Trust, identity: Option<&Identity>) -> Result<ClientConfig, rustls::Error> {
    let provider = provider();
    let verifier: Arc<dyn ServerCertVerifier> = match trust {
        Trust::Anything => Arc::new(AcceptAnyCertificate(provider.clone())),
        Trust::Chain {
            roots,
            check_name: true,
        } => WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| rustls::Error::General(e.to_string()))?,
        Trust::Chain {
            roots,
            check_name: false,
        } => Arc::new(ChainOnly {
            roots: roots.clone(),
            provider: provider.clone(),
        }),
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match identity {
        Some(identity) => builder.with_client_auth_cert(identity.certs.clone(), identity.key.clone_key()),
        None => Ok(builder.with_no_client_auth()),
    }
}

/// The handshake-signature half of a [`ServerCertVerifier`], the same for
/// every verifier here: whatever a verifier decides about the certificate,
/// the peer must prove it holds the certificate's key.
macro_rules! handshake_signatures {
    ($self:ident => $provider:expr) => {
        fn verify_tls12_signature(
            &$self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls12_signature(message, cert, dss, &$provider.signature_verification_algorithms)
        }

        fn verify_tls13_signature(
            &$self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls13_signature(message, cert, dss, &$provider.signature_verification_algorithms)
        }

        fn supported_verify_schemes(&$self) -> Vec<SignatureScheme> {
            $provider.signature_verification_algorithms.supported_schemes()
        }
    };
}

/// Encryption without authentication: what libpq's `require` does without
/// a CA. The handshake signature is still checked, so the peer holds the
/// key of the certificate it sent.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    handshake_signatures!(self => &self.0);
}

/// libpq's `verify-ca`: the chain must end at a trusted CA and be valid
/// now; the host name is not compared (the server may be reached by an
/// address its certificate does not list, e.g. through a tunnel).
#[derive(Debug)]
struct ChainOnly {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    handshake_signatures!(self => &self.provider);
}

/// The TLS error of `error` itself (not its causes), if it is one: rustls
/// errors reach us directly or inside an `io::Error` (whose `source()`
/// skips the error it wraps, so it is unwrapped by hand).
fn rustls_error<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = error.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    let inner = error.downcast_ref::<io::Error>()?.get_ref()?;
    rustls_error(inner)
}

/// Whether `error` or one of its causes is a TLS failure.
pub fn is_tls_failure(error: &(dyn StdError + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(current) = next {
        if rustls_error(current).is_some() {
            return true;
        }
        next = current.source();
    }
    false
}

/// `error` in words, when it is a TLS failure (this level only; callers
/// that print a chain of causes ask for each).
pub fn describe(error: &(dyn StdError + 'static)) -> Option<String> {
    rustls_error(error).map(describe_rustls)
}

/// The first TLS failure in `error`'s chain, in words.
pub fn describe_chain(error: &(dyn StdError + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(current) = next {
        if let Some(text) = describe(current) {
            return Some(text);
        }
        next = current.source();
    }
    None
}

fn describe_rustls(error: &rustls::Error) -> String {
    match error {
        rustls::Error::InvalidCertificate(certificate) => describe_certificate(certificate),
        rustls::Error::AlertReceived(alert) => describe_alert(*alert),
        rustls::Error::InconsistentKeys(_) => {
            format!("TLS client certificate and key do not match ({error})")
        }
        other => format!("TLS failure: {other}"),
    }
}

fn describe_certificate(error: &CertificateError) -> String {
    match error {
        CertificateError::UnknownIssuer => {
            "server certificate is not signed by a trusted CA (unknown CA): check the CA file (sslrootcert, OUTBOX_AMQP_CA_FILE)".to_owned()
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            format!("server certificate has expired ({error})")
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            format!("server certificate is not valid yet ({error})")
        }
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            format!("server certificate does not match the host name (name mismatch: {error})")
        }
        CertificateError::Revoked => "server certificate has been revoked".to_owned(),
        CertificateError::BadSignature => {
            "server certificate has an invalid signature (bad signature)".to_owned()
        }
        CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => {
            format!("server certificate is not for TLS servers ({error})")
        }
        other => format!("server certificate rejected: {other}"),
    }
}

fn describe_alert(alert: AlertDescription) -> String {
    match alert {
        AlertDescription::CertificateRequired => {
            "the server requires a client certificate, and none was configured".to_owned()
        }
        AlertDescription::UnknownCA => {
            "the server rejected the client certificate: its CA is unknown to the server".to_owned()
        }
        AlertDescription::CertificateExpired => {
            "the server rejected the client certificate: it has expired".to_owned()
        }
        AlertDescription::BadCertificate
        | AlertDescription::UnsupportedCertificate
        | AlertDescription::CertificateRevoked
        | AlertDescription::CertificateUnknown
        | AlertDescription::AccessDenied => {
            format!("the server rejected the client certificate ({alert:?})")
        }
        AlertDescription::HandshakeFailure => "the server ended the TLS handshake (handshake failure: \
             it may require a client certificate, or share no protocol version or cipher with the relay)"
            .to_owned(),
        AlertDescription::ProtocolVersion => {
            "the server offers no TLS version the relay accepts (TLS 1.2 or 1.3)".to_owned()
        }
        other => format!("the server sent the TLS alert {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_errors_are_found_inside_io_errors() {
        let io = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
        );
        assert!(describe(&io).unwrap().contains("unknown CA"));
        let wrapped = io::Error::other(io);
        assert!(describe(&wrapped).unwrap().contains("unknown CA"));
        assert!(describe(&io::Error::other("plain")).is_none());
    }

    #[test]
    fn certificate_problems_are_named() {
        let name = rustls::Error::InvalidCertificate(CertificateError::NotValidForName);
        assert!(describe(&name).unwrap().contains("name mismatch"));
        let expired = rustls::Error::InvalidCertificate(CertificateError::Expired);
        assert!(describe(&expired).unwrap().contains("expired"));
        let required = rustls::Error::AlertReceived(AlertDescription::CertificateRequired);
        assert!(describe(&required)
            .unwrap()
            .contains("requires a client certificate"));
    }

    #[test]
    fn missing_files_name_the_path_and_reason() {
        let error = read_certificates(Path::new("/nonexistent/ca.pem")).unwrap_err();
        assert_eq!(
            error.0,
            "cannot read /nonexistent/ca.pem: No such file or directory"
        );
    }
}
