//! Sealing secret values: XChaCha20-Poly1305 under a 32-byte master key.
//!
//! Nonces are 24 random bytes, which is safe for random generation at any
//! volume a node will see. The associated data binds a sealed value to its
//! secret's name and version, so a value copied onto another record (or an
//! old version put back under a newer version number) does not open.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

/// Bytes in a master key.
pub const KEY_BYTES: usize = 32;
/// Bytes in a nonce.
const NONCE_BYTES: usize = 24;

/// A master key. Its bytes never leave this type, and neither `Debug` nor
/// anything else prints them: only its [`id`](Self::id).
pub struct MasterKey {
    key: Zeroizing<[u8; KEY_BYTES]>,
    id: String,
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MasterKey({})", self.id)
    }
}

/// A decrypted secret value. It is wiped from memory when dropped and has
/// no `Debug` or `Display`: the only way to its bytes is
/// [`expose`](Self::expose), at the one place that sends it.
pub struct SecretValue(Zeroizing<Vec<u8>>);

impl SecretValue {
    /// The plaintext, for substitution into an outbound request.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

/// Why a value does not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// Sealed under another master key.
    #[error("sealed under master key {0}, which this node does not have")]
    UnknownKey(String),
    /// The ciphertext, nonce, name or version does not match.
    #[error("the sealed value does not verify (corrupted, or moved from another secret)")]
    Corrupt,
}

impl MasterKey {
    /// A key from its base64 text (as `marmot secrets new-key` prints it).
    pub fn from_base64(text: &str) -> Result<Self, String> {
        let bytes = Zeroizing::new(
            B64.decode(text.trim())
                .map_err(|_| "a master key is base64 of 32 bytes".to_owned())?,
        );
        let key: [u8; KEY_BYTES] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| format!("a master key is 32 bytes, not {}", bytes.len()))?;
        Ok(Self::from_bytes(key))
    }

    /// A fresh random key.
    pub fn generate() -> Self {
        Self::from_bytes(rand::random())
    }

    fn from_bytes(key: [u8; KEY_BYTES]) -> Self {
        let key = Zeroizing::new(key);
        let digest = Sha256::digest(key.as_slice());
        Self {
            id: hex::encode(&digest[..4]),
            key,
        }
    }

    /// The key as base64 text, for its file.
    pub fn to_base64(&self) -> Zeroizing<String> {
        Zeroizing::new(B64.encode(self.key.as_slice()))
    }

    /// A short, public name of the key (a hash prefix), stored with every
    /// value it seals.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A key for another purpose, derived from this one (HMAC-SHA256 of
    /// `purpose` under the master key): the master key itself is used for
    /// nothing but sealing secrets.
    pub fn derive(&self, purpose: &str) -> Zeroizing<[u8; KEY_BYTES]> {
        use hmac::Mac as _;
        let mut mac = <hmac::Hmac<Sha256> as hmac::Mac>::new_from_slice(self.key.as_slice())
            .expect("HMAC takes any key length");
        mac.update(purpose.as_bytes());
        Zeroizing::new(mac.finalize().into_bytes().into())
    }

    /// Seal `value` as version `version` of secret `name`: (nonce, sealed).
    pub fn seal(&self, name: &str, version: u64, value: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let nonce: [u8; NONCE_BYTES] = rand::random();
        let aad = associated_data(name, version);
        let sealed = self
            .cipher()
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: value,
                    aad: &aad,
                },
            )
            .expect("XChaCha20-Poly1305 encryption does not fail for in-memory values");
        (nonce.to_vec(), sealed)
    }

    /// Open what [`seal`](Self::seal) made.
    pub fn open(
        &self,
        name: &str,
        version: u64,
        nonce: &[u8],
        sealed: &[u8],
    ) -> Result<SecretValue, OpenError> {
        if nonce.len() != NONCE_BYTES {
            return Err(OpenError::Corrupt);
        }
        let aad = associated_data(name, version);
        self.cipher()
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: &aad,
                },
            )
            .map(|v| SecretValue(Zeroizing::new(v)))
            .map_err(|_| OpenError::Corrupt)
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new(self.key.as_slice().into())
    }
}

fn associated_data(name: &str, version: u64) -> Vec<u8> {
    format!("marmot-secret/v1\0{name}\0{version}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_as_their_name_and_version() {
        let key = MasterKey::generate();
        let (nonce, sealed) = key.seal("API_KEY", 3, b"sk-live-123");
        assert!(!sealed.windows(11).any(|w| w == b"sk-live-123"));
        let opened = key.open("API_KEY", 3, &nonce, &sealed).unwrap();
        assert_eq!(opened.expose(), b"sk-live-123");
        assert_eq!(
            key.open("OTHER", 3, &nonce, &sealed).err(),
            Some(OpenError::Corrupt)
        );
        assert_eq!(
            key.open("API_KEY", 2, &nonce, &sealed).err(),
            Some(OpenError::Corrupt)
        );
        let mut flipped = sealed.clone();
        flipped[0] ^= 1;
        assert!(key.open("API_KEY", 3, &nonce, &flipped).is_err());
        let other = MasterKey::generate();
        assert!(other.open("API_KEY", 3, &nonce, &sealed).is_err());
    }

    #[test]
    fn keys_round_trip_and_never_print_their_bytes() {
        let key = MasterKey::generate();
        let text = key.to_base64();
        let again = MasterKey::from_base64(&text).unwrap();
        assert_eq!(again.id(), key.id());
        let shown = format!("{key:?}");
        assert!(!shown.contains(text.as_str()), "{shown}");
        assert_eq!(shown, format!("MasterKey({})", key.id()));
        assert!(MasterKey::from_base64("c2hvcnQ=").is_err());
        assert!(MasterKey::from_base64("not base64!").is_err());
    }
}
