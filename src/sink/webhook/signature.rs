//! Standard Webhooks signatures (<https://www.standardwebhooks.com/>): every request carries
//! `webhook-id` (the event id), `webhook-timestamp` (Unix seconds of this attempt) and
//! `webhook-signature`, `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">` for each
//! configured key, space-separated, so a receiver that knows any one of them verifies (key
//! rotation).
//!
//! Invariant: a request is signed at the moment of each attempt, never once for all: receivers
//! refuse timestamps older than their tolerance (five minutes in the official libraries), and a
//! retry may come much later than the first try.

use base64::Engine as _;
use ring::hmac;

use super::config::SigningKey;

/// The HMAC keys of `[webhook] secret`, ready to sign.
pub(crate) struct Signer {
    keys: Vec<hmac::Key>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signer({} keys)", self.keys.len())
    }
}

impl Signer {
    /// `None` when no secret is configured (requests go unsigned).
    pub(crate) fn new(keys: &[SigningKey]) -> Option<Signer> {
        (!keys.is_empty()).then(|| Signer {
            keys: keys
                .iter()
                .map(|k| hmac::Key::new(hmac::HMAC_SHA256, k.expose()))
                .collect(),
        })
    }

    /// The `webhook-signature` value of `body` sent as message `id` at `timestamp`.
    pub(crate) fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        let mut out = String::with_capacity(self.keys.len() * 48);
        let stamp = timestamp.to_string();
        for key in &self.keys {
            let mut ctx = hmac::Context::with_key(key);
            ctx.update(id.as_bytes());
            ctx.update(b".");
            ctx.update(stamp.as_bytes());
            ctx.update(b".");
            ctx.update(body);
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str("v1,");
            base64::engine::general_purpose::STANDARD.encode_string(ctx.sign().as_ref(), &mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_specifications_example() {
        // The example of the Standard Webhooks specification (spec/standard-webhooks.md,
        // "Signature scheme") and of its libraries' test suites.
        let key = base64::engine::general_purpose::STANDARD
            .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .unwrap();
        let signer = Signer::new(&[SigningKey::for_test(key)]).unwrap();
        assert_eq!(
            signer.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, br#"{"test": 2432232314}"#),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn one_signature_per_key_space_separated() {
        let signer = Signer::new(&[SigningKey::for_test(vec![1; 32]), SigningKey::for_test(vec![2; 32])]).unwrap();
        let sig = signer.sign("1", 1, b"{}");
        let parts: Vec<&str> = sig.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert!(parts.iter().all(|p| p.starts_with("v1,") && p.len() == 3 + 44), "{sig}");
        assert_ne!(parts[0], parts[1]);
        assert!(Signer::new(&[]).is_none());
    }
}
