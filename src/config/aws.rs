//! What every AWS sink's section (`[sqs]`, `[sns]`, `[kinesis]`) shares: `region` and
//! `endpoint_url`, checked the same way and left to the SDK's chain (`AWS_REGION`,
//! `AWS_ENDPOINT_URL`, the profile) when absent; the `headers` mode of the sinks with message
//! attributes; booleans as environment overrides spell them.
//!
//! Invariant: a leaf like the rest of `config`; nothing here is secret (credentials are never in
//! a section: the SDK's default chain finds them).

use crate::config::ConfigError;

fn invalid(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        message: message.into(),
    }
}

/// `key` (e.g. `"sqs.region"`): `None` leaves the region to the SDK's chain.
pub(crate) fn region(key: &'static str, value: Option<&str>) -> Result<Option<String>, ConfigError> {
    match value.map(str::trim) {
        None => Ok(None),
        Some(r) if valid_region(r) => Ok(Some(r.to_owned())),
        Some(r) => Err(invalid(
            key,
            format!("{r:?} is not an AWS region name (e.g. \"eu-west-1\"); fix it or leave it out for AWS_REGION"),
        )),
    }
}

/// `key` (e.g. `"sqs.endpoint_url"`): `None` (or empty) leaves the endpoint to the SDK's chain;
/// `example` is the service's regional endpoint, shown in the error.
pub(crate) fn endpoint_url(
    key: &'static str,
    value: Option<&str>,
    example: &str,
) -> Result<Option<String>, ConfigError> {
    match value.map(str::trim) {
        None | Some("") => Ok(None),
        Some(url) => validate_endpoint(key, url, example).map(Some),
    }
}

/// `xx-name-N` (`us-east-1`, `ap-southeast-2`, `us-gov-west-1`, `eu-isoe-west-1`).
fn valid_region(r: &str) -> bool {
    let parts: Vec<&str> = r.split('-').collect();
    parts.len() >= 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()))
        && parts.last().is_some_and(|p| p.chars().all(|c| c.is_ascii_digit()))
}

/// An `http(s)://host[:port][/]` URL (a local emulator, a VPC endpoint).
fn validate_endpoint(key: &'static str, url: &str, example: &str) -> Result<String, ConfigError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(invalid(
            key,
            format!("{url:?} is not an absolute URL; write e.g. \"{example}\""),
        ));
    };
    if scheme != "http" && scheme != "https" {
        return Err(invalid(key, format!("{url:?} is not http:// or https://")));
    }
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    if authority.is_empty() || authority.contains('@') {
        return Err(invalid(
            key,
            "needs a host and no user:password@ (credentials come from the AWS credential chain)",
        ));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

/// How a record's headers travel as message attributes (SQS and SNS allow 10 per message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderMode {
    /// Each header is a message attribute of its own (`id` and `key` take two, exactly-once's
    /// position three more): a record with more than 10 in all is refused.
    Attributes,
    /// All headers in one attribute, `headers`, a JSON object (any number).
    Json,
}

/// `key` (e.g. `"sqs.headers"`): `"attributes"` (the default) or `"json"`.
pub(crate) fn header_mode(key: &'static str, value: Option<&str>) -> Result<HeaderMode, ConfigError> {
    match value.map(str::trim) {
        None | Some("attributes") => Ok(HeaderMode::Attributes),
        Some("json") => Ok(HeaderMode::Json),
        Some(other) => Err(invalid(
            key,
            format!("{other:?} is not a header mode; use \"attributes\" (the default) or \"json\""),
        )),
    }
}

/// A boolean, or its spelling in an environment override (`"true"`, `"false"`).
pub(crate) fn optional_bool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum BoolOrText {
        Bool(bool),
        Text(String),
    }
    match <BoolOrText as serde::Deserialize>::deserialize(d)? {
        BoolOrText::Bool(b) => Ok(Some(b)),
        BoolOrText::Text(t) => match t.trim() {
            "true" => Ok(Some(true)),
            "false" => Ok(Some(false)),
            other => Err(serde::de::Error::custom(format!("{other:?} is not true or false"))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_and_endpoints_are_checked_and_name_their_key() {
        assert_eq!(region("x.region", None).unwrap(), None);
        for ok in ["us-east-1", "ap-southeast-2", "us-gov-west-1", "eu-isoe-west-1"] {
            assert_eq!(region("x.region", Some(ok)).unwrap().as_deref(), Some(ok));
        }
        for bad in ["Europe", "eu-west", "eu--1", "EU-WEST-1"] {
            let e = region("x.region", Some(bad)).unwrap_err().to_string();
            assert!(e.contains("x.region") && e.contains("AWS_REGION"), "{bad}: {e}");
        }
        let ex = "https://sqs.eu-west-1.amazonaws.com";
        assert_eq!(endpoint_url("x.endpoint_url", Some(" "), ex).unwrap(), None);
        assert_eq!(
            endpoint_url("x.endpoint_url", Some("http://127.0.0.1:5000/"), ex)
                .unwrap()
                .as_deref(),
            Some("http://127.0.0.1:5000")
        );
        for (bad, says) in [
            ("localhost:5000", "sqs.eu-west-1"),
            ("ftp://h", "not http"),
            ("http://k:s@h", "credential chain"),
            ("http:///x", "needs a host"),
        ] {
            let e = endpoint_url("x.endpoint_url", Some(bad), ex).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("x.endpoint_url"), "{bad}: {e}");
        }
    }
}
