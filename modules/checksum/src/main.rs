//! `checksum`: a SHA-2 digest of a UTF-8 string, hex-encoded. (Named `checksum`,
//! not `digest`, because `cargo -p digest` would be ambiguous with the
//! RustCrypto `digest` crate in the dependency graph.)
//!
//! Payload `{"data": "...", "algorithm": "sha256"}` (`algorithm` optional,
//! default `sha256`; one of `sha224`, `sha256`, `sha384`, `sha512`, case and
//! a dash ignored, so `SHA-256` works) → `{"algorithm": "sha256", "hex": "..."}`
//! with the canonical algorithm name. An unknown algorithm is a permanent
//! failure: retrying cannot make it known.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha224, Sha256, Sha384, Sha512};
use sweep_guest::Error;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    data: String,
    #[serde(default = "default_algorithm")]
    algorithm: String,
}

fn default_algorithm() -> String {
    Algorithm::Sha256.name().to_string()
}

#[derive(Debug, PartialEq, Serialize)]
struct Output {
    algorithm: &'static str,
    hex: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Algorithm {
    Sha224,
    Sha256,
    Sha384,
    Sha512,
}

impl Algorithm {
    const ALL: [Algorithm; 4] = [Self::Sha224, Self::Sha256, Self::Sha384, Self::Sha512];

    fn name(self) -> &'static str {
        match self {
            Self::Sha224 => "sha224",
            Self::Sha256 => "sha256",
            Self::Sha384 => "sha384",
            Self::Sha512 => "sha512",
        }
    }

    fn parse(requested: &str) -> Result<Self, Error> {
        let normalised = requested.trim().to_ascii_lowercase().replace('-', "");
        Self::ALL.into_iter().find(|algorithm| algorithm.name() == normalised).ok_or_else(|| {
            let known: Vec<&str> = Self::ALL.iter().map(|a| a.name()).collect();
            Error::permanent(format!(
                "unknown algorithm {requested:?}; supported: {}",
                known.join(", ")
            ))
        })
    }

    fn digest(self, data: &[u8]) -> Vec<u8> {
        match self {
            Self::Sha224 => Sha224::digest(data).to_vec(),
            Self::Sha256 => Sha256::digest(data).to_vec(),
            Self::Sha384 => Sha384::digest(data).to_vec(),
            Self::Sha512 => Sha512::digest(data).to_vec(),
        }
    }
}

fn handle(input: Input) -> Result<Output, Error> {
    let algorithm = Algorithm::parse(&input.algorithm)?;
    Ok(Output {
        algorithm: algorithm.name(),
        hex: hex::encode(algorithm.digest(input.data.as_bytes())),
    })
}

fn main() {
    sweep_guest::run(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex_of(algorithm: &str, data: &str) -> Result<String, Error> {
        let input = Input { data: data.to_string(), algorithm: algorithm.to_string() };
        handle(input).map(|out| out.hex)
    }

    #[test]
    fn known_vectors() {
        // FIPS 180-2 test vectors for "abc".
        assert_eq!(
            hex_of("sha256", "abc").expect("sha256"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex_of("sha224", "abc").expect("sha224"),
            "23097d223405d8228642a477bda255b32aadbce4bda0b3f7e36c9da7"
        );
        assert!(hex_of("sha384", "abc")
            .expect("sha384")
            .starts_with("cb00753f45a35e8bb5a03d699ac65007"));
        assert!(hex_of("sha512", "abc")
            .expect("sha512")
            .starts_with("ddaf35a193617abacc417349ae204131"));
        assert_eq!(
            hex_of("sha256", "").expect("empty"),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn algorithm_names_are_forgiving_and_canonical() {
        let input = Input { data: "abc".into(), algorithm: " SHA-256 ".into() };
        assert_eq!(handle(input).expect("sha256").algorithm, "sha256");
    }

    #[test]
    fn unknown_algorithm_is_permanent() {
        let err = hex_of("md5", "abc").expect_err("md5 is not offered");
        assert!(err.is_permanent());
        assert!(err.message().contains("\"md5\""), "{err}");
        assert!(err.message().contains("sha512"), "{err}");
    }

    #[test]
    fn algorithm_defaults_to_sha256() {
        let input: Input = serde_json::from_str(r#"{"data": "abc"}"#).expect("valid");
        assert_eq!(handle(input).expect("ok").algorithm, "sha256");
    }
}
