//! What a guest is given beyond computing: the hosts it may reach, its HTTP limits and the
//! environment (named secrets) it sees, and what it used of them.
//!
//! Owns: [`EgressPolicy`] (a tenant's allow list, parsed and matched), [`HttpLimits`],
//! [`Capabilities`] (everything one run is given) and [`Usage`] (what one run used).
//!
//! Invariants:
//! - the default is nothing: [`Capabilities::none`] allows no host and sets no variable;
//! - a policy only ever holds entries that [`EgressPolicy::parse`] accepted, in canonical
//!   form (lowercase, no trailing dot), so what an API shows is what is matched;
//! - an address that is not public ([`is_public`] false: loopback, private, link-local,
//!   unique-local, multicast, unspecified, documentation, ...) is reachable only through an
//!   entry naming that exact IP literal ([`EgressPolicy::allows_address`]); a hostname on the
//!   list never makes one reachable, whatever it resolves to.
//!
//! Entry grammar (`EgressPolicy::parse`): `host[:port]`, where host is a DNS name
//! (`api.mail.example`), a leading-wildcard name (`*.example.org`: any name ending in
//! `.example.org`, at any depth, not `example.org` itself), an IPv4 literal (`127.0.0.1`) or
//! a bracketed IPv6 literal (`[::1]`). Without a port an entry allows every port.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// Most entries one allow list may hold.
pub const MAX_EGRESS_ENTRIES: usize = 100;
/// Longest entry, in bytes (a DNS name is at most 253, plus `:65535`).
pub const MAX_EGRESS_ENTRY_BYTES: usize = 260;

/// Default: outbound HTTP requests one task may make.
pub const DEFAULT_HTTP_REQUESTS: u32 = 50;
/// Default: response body bytes one task may receive, all its requests together.
pub const DEFAULT_HTTP_RESPONSE_BYTES: u64 = 10 * 1024 * 1024;
/// Default: how long one request may take, from connect to the last byte of its response.
pub const DEFAULT_HTTP_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why an allow-list entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    /// More than [`MAX_EGRESS_ENTRIES`] entries.
    #[error("at most {MAX_EGRESS_ENTRIES} entries, got {0}")]
    TooMany(usize),
    /// One entry does not parse.
    #[error("entry {index} ({entry:?}): {reason}")]
    Entry {
        /// 0-based position in the list.
        index: usize,
        /// The entry as given (cut to [`MAX_EGRESS_ENTRY_BYTES`]).
        entry: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    /// A DNS name, lowercase, no trailing dot.
    Name(String),
    /// `*.suffix`: stores `.suffix`.
    Wildcard(String),
    /// An IP literal.
    Ip(IpAddr),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    host: Host,
    port: Option<u16>,
}

impl Rule {
    fn port_matches(&self, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Name(name) => f.write_str(name)?,
            Host::Wildcard(suffix) => write!(f, "*{suffix}")?,
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}")?,
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]")?,
        }
        match self.port {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

/// A tenant's egress allow list: which hosts (and ports) its handlers may send HTTP requests
/// to. Empty (the default) allows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    rules: Vec<Rule>,
}

impl EgressPolicy {
    /// The policy that allows nothing.
    pub fn deny_all() -> EgressPolicy {
        EgressPolicy::default()
    }

    /// Parses an allow list (see the module doc for the grammar). Duplicates collapse; the
    /// order of [`EgressPolicy::entries`] is canonical, not the input's.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<EgressPolicy, EgressError> {
        if entries.len() > MAX_EGRESS_ENTRIES {
            return Err(EgressError::TooMany(entries.len()));
        }
        // Keyed by the canonical text, so duplicates collapse and the order is the text's.
        let mut rules = BTreeMap::new();
        for (index, entry) in entries.iter().enumerate() {
            let entry = entry.as_ref();
            let rule = parse_rule(entry).map_err(|reason| EgressError::Entry {
                index,
                entry: cut(entry, MAX_EGRESS_ENTRY_BYTES).to_owned(),
                reason,
            })?;
            rules.insert(rule.to_string(), rule);
        }
        Ok(EgressPolicy { rules: rules.into_values().collect() })
    }

    /// True when nothing is allowed.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The entries in canonical form (what the API shows and stores).
    pub fn entries(&self) -> Vec<String> {
        self.rules.iter().map(Rule::to_string).collect()
    }

    /// May a request name `host` (a URL's host: a DNS name, an IPv4 literal or a bracketed or
    /// bare IPv6 literal) on `port`? Says nothing about the address a name resolves to: check
    /// each address connected to with [`EgressPolicy::allows_address`].
    pub fn allows_host(&self, host: &str, port: u16) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(&host);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return self.names_ip(ip, port);
        }
        self.rules.iter().any(|rule| {
            rule.port_matches(port)
                && match &rule.host {
                    Host::Name(name) => *name == host,
                    Host::Wildcard(suffix) => {
                        host.len() > suffix.len() && host.ends_with(suffix.as_str())
                    }
                    Host::Ip(_) => false,
                }
        })
    }

    /// May a connection go to `addr`? A public address, yes (the name was checked by
    /// [`EgressPolicy::allows_host`]); any other only when an entry names that exact IP
    /// literal with a matching port.
    pub fn allows_address(&self, addr: SocketAddr) -> bool {
        is_public(addr.ip()) || self.names_ip(addr.ip(), addr.port())
    }

    fn names_ip(&self, ip: IpAddr, port: u16) -> bool {
        let ip = canonical_ip(ip);
        self.rules.iter().any(|rule| rule.host == Host::Ip(ip) && rule.port_matches(port))
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:127.0.0.1`) is the IPv4 address it carries.
fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// Is `ip` an address on the public internet? False for loopback, private (RFC 1918),
/// shared (100.64/10), link-local (169.254/16, fe80::/10: cloud metadata lives there),
/// unique-local (fc00::/7), multicast, broadcast, unspecified, documentation and benchmarking
/// ranges, the IETF protocol block (192.0.0/24), reserved (240/4) and the IPv6 forms that
/// carry such an IPv4 address (mapped, NAT64 well-known prefix, 6to4).
pub fn is_public(ip: IpAddr) -> bool {
    match canonical_ip(ip) {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (b == 18 || b == 19))
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let seg = ip.segments();
    // 64:ff9b::/96 (NAT64) and 2002::/16 (6to4) embed an IPv4 address.
    if seg[0..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let [a, b] = seg[6].to_be_bytes();
        let [c, d] = seg[7].to_be_bytes();
        return is_public_v4(Ipv4Addr::new(a, b, c, d));
    }
    if seg[0] == 0x2002 {
        let [a, b] = seg[1].to_be_bytes();
        let [c, d] = seg[2].to_be_bytes();
        return is_public_v4(Ipv4Addr::new(a, b, c, d));
    }
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (seg[0] & 0xfe00) == 0xfc00 // unique local
        || (seg[0] & 0xffc0) == 0xfe80 // link local
        || (seg[0] & 0xffc0) == 0xfec0 // site local (deprecated)
        || (seg[0] == 0x2001 && seg[1] == 0x0db8) // documentation
        || seg[0..6] == [0, 0, 0, 0, 0, 0]) // IPv4-compatible, deprecated
}

fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn parse_rule(entry: &str) -> Result<Rule, &'static str> {
    if entry.is_empty() {
        return Err("empty");
    }
    if entry.len() > MAX_EGRESS_ENTRY_BYTES {
        return Err("too long");
    }
    if entry.contains("://") || entry.contains('/') {
        return Err("a host with an optional port, not a URL");
    }
    // A bracketed IPv6 literal, with or without a port.
    if let Some(rest) = entry.strip_prefix('[') {
        let (ip, after) = rest.split_once(']').ok_or("unclosed '['")?;
        let ip: Ipv6Addr = ip.parse().map_err(|_| "not an IPv6 address inside '[]'")?;
        let port = match after {
            "" => None,
            _ => Some(parse_port(after.strip_prefix(':').ok_or("junk after ']'")?)?),
        };
        return Ok(Rule { host: Host::Ip(canonical_ip(IpAddr::V6(ip))), port });
    }
    if entry.parse::<Ipv6Addr>().is_ok() {
        return Err("an IPv6 literal goes in brackets: [::1] or [::1]:8080");
    }
    let (host, port) = match entry.rsplit_once(':') {
        Some((host, port)) => (host, Some(parse_port(port)?)),
        None => (entry, None),
    };
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return Ok(Rule { host: Host::Ip(IpAddr::V4(ip)), port });
    }
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let (wildcard, name) = match host.strip_prefix("*.") {
        Some(name) => (true, name),
        None => (false, host.as_str()),
    };
    check_dns_name(name)?;
    if name.split('.').all(|label| label.bytes().all(|b| b.is_ascii_digit())) {
        return Err("not a valid IPv4 address or host name");
    }
    let host = if wildcard {
        if !name.contains('.') {
            return Err("a wildcard needs at least two labels after '*.' (*.example.org)");
        }
        Host::Wildcard(format!(".{name}"))
    } else {
        Host::Name(name.to_owned())
    };
    Ok(Rule { host, port })
}

fn parse_port(port: &str) -> Result<u16, &'static str> {
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err("the port must be a number from 1 to 65535");
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Err("the port must be a number from 1 to 65535"),
        Ok(port) => Ok(port),
    }
}

fn check_dns_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 253 {
        return Err("a host name is 1 to 253 characters");
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("each label of a host name is 1 to 63 characters");
        }
        if label.contains('*') {
            return Err("'*' only as the whole first label (*.example.org)");
        }
        if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err("a host name has letters, digits, '-' and '_' only");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label of a host name neither starts nor ends with '-'");
        }
    }
    Ok(())
}

/// Limits on one task's outbound HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Requests one task may send (refused ones included: a guest cannot probe the list
    /// without bound); the next fails inside the guest.
    pub max_requests: u32,
    /// Response body bytes one task may receive over all its requests; past it the body's
    /// stream fails inside the guest.
    pub max_response_bytes: u64,
    /// Time one request may take, connect to last byte.
    pub request_timeout: Duration,
}

impl HttpLimits {
    /// The deployment defaults.
    pub const DEFAULT: HttpLimits = HttpLimits {
        max_requests: DEFAULT_HTTP_REQUESTS,
        max_response_bytes: DEFAULT_HTTP_RESPONSE_BYTES,
        request_timeout: DEFAULT_HTTP_REQUEST_TIMEOUT,
    };
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits::DEFAULT
    }
}

/// Everything one run is given beyond its payload: where it may send HTTP requests, under
/// which limits, and the environment variables (its module's named secrets) it sees.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// The tenant's allow list.
    pub egress: Arc<EgressPolicy>,
    /// Limits on the run's HTTP requests.
    pub http: HttpLimits,
    /// `(name, value)` pairs added to the guest's environment: the secrets its module names.
    pub env: Vec<(String, String)>,
}

impl Capabilities {
    /// No host, no variable: what a run gets unless it is given more on purpose.
    pub fn none() -> Capabilities {
        Capabilities::default()
    }
}

// Secret values never reach a log line through `{:?}`.
impl fmt::Debug for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.env.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("Capabilities")
            .field("egress", &self.egress.entries())
            .field("http", &self.http)
            .field("env", &names)
            .finish()
    }
}

/// What one run used, recorded per attempt and summed per tenant for billing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Fuel consumed (instantiation included).
    pub fuel_used: u64,
    /// The largest linear memory the guest held, in bytes.
    pub peak_memory_bytes: u64,
    /// HTTP requests sent (the policy allowed them and a connection was attempted).
    pub http_requests: u32,
    /// HTTP requests refused before any connection: off the list, a non-public address,
    /// over the request limit.
    pub http_refused: u32,
    /// Request bytes sent (bodies; headers are not counted).
    pub bytes_sent: u64,
    /// Response body bytes received.
    pub bytes_received: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(entries: &[&str]) -> EgressPolicy {
        EgressPolicy::parse(entries).expect("valid policy")
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("socket address")
    }

    #[test]
    fn the_default_allows_nothing() {
        let p = EgressPolicy::deny_all();
        assert!(p.is_empty());
        assert!(!p.allows_host("example.com", 443));
        assert!(!p.allows_host("127.0.0.1", 80));
        assert!(!p.allows_address(addr("127.0.0.1:80")));
        assert!(Capabilities::none().egress.is_empty());
    }

    #[test]
    fn names_wildcards_and_ports_match_as_written() {
        let p = policy(&["API.Mail.Example.", "*.example.org", "hooks.example.net:8443"]);
        assert_eq!(p.entries(), ["*.example.org", "api.mail.example", "hooks.example.net:8443"]);
        assert!(p.allows_host("api.mail.example", 443));
        assert!(p.allows_host("API.MAIL.EXAMPLE.", 25));
        assert!(!p.allows_host("mail.example", 443));
        assert!(!p.allows_host("xapi.mail.example", 443));
        assert!(p.allows_host("a.example.org", 443));
        assert!(p.allows_host("a.b.example.org", 80));
        assert!(!p.allows_host("example.org", 443));
        assert!(!p.allows_host("badexample.org", 443));
        assert!(p.allows_host("hooks.example.net", 8443));
        assert!(!p.allows_host("hooks.example.net", 443));
    }

    #[test]
    fn private_addresses_need_their_literal() {
        let p = policy(&["localhost", "mail.test", "127.0.0.1:8025", "[::1]"]);
        // The name is on the list, but what it resolves to must be named as a literal.
        assert!(p.allows_host("mail.test", 8025));
        assert!(p.allows_address(addr("127.0.0.1:8025")));
        assert!(!p.allows_address(addr("127.0.0.1:8026")));
        assert!(!p.allows_address(addr("127.0.0.2:8025")));
        assert!(!p.allows_address(addr("10.0.0.1:8025")));
        assert!(p.allows_address(addr("[::1]:9")));
        assert!(p.allows_address(addr("[::ffff:127.0.0.1]:8025")));
        assert!(p.allows_host("127.0.0.1", 8025));
        assert!(p.allows_host("[::1]", 80));
        assert!(!p.allows_host("127.0.0.1", 80));
        // Public addresses pass the address check (the name check came first).
        assert!(p.allows_address(addr("93.184.216.34:443")));
    }

    #[test]
    fn non_public_ranges_are_refused() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "192.0.0.8",
            "198.18.0.1",
            "240.0.0.1",
            "::",
            "::1",
            "fe80::1",
            "fd00::1",
            "ff02::1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
            "2001:db8::1",
        ] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert!(!is_public(ip), "{ip} counted as public");
        }
        for ip in ["93.184.216.34", "1.1.1.1", "2606:4700::1111", "64:ff9b::101:101"] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert!(is_public(ip), "{ip} counted as not public");
        }
    }

    #[test]
    fn bad_entries_name_their_index_and_reason() {
        for (entry, reason) in [
            ("", "empty"),
            ("https://example.com", "a host with an optional port, not a URL"),
            ("example.com:0", "the port must be a number from 1 to 65535"),
            ("example.com:70000", "the port must be a number from 1 to 65535"),
            ("example.com:", "the port must be a number from 1 to 65535"),
            ("*", "'*' only as the whole first label (*.example.org)"),
            ("*.com", "a wildcard needs at least two labels after '*.' (*.example.org)"),
            ("a.*.example.com", "'*' only as the whole first label (*.example.org)"),
            ("exa mple.com", "a host name has letters, digits, '-' and '_' only"),
            ("::1", "an IPv6 literal goes in brackets: [::1] or [::1]:8080"),
            ("[::1", "unclosed '['"),
            ("999.1.1.1", "not a valid IPv4 address or host name"),
            ("-a.example.com", "a label of a host name neither starts nor ends with '-'"),
        ] {
            let err = EgressPolicy::parse(&["ok.example", entry]).expect_err(entry);
            assert_eq!(
                err,
                EgressError::Entry { index: 1, entry: entry.to_owned(), reason },
                "{entry:?}"
            );
        }
        let many: Vec<String> = (0..=MAX_EGRESS_ENTRIES).map(|i| format!("h{i}.example")).collect();
        assert_eq!(EgressPolicy::parse(&many), Err(EgressError::TooMany(MAX_EGRESS_ENTRIES + 1)));
    }

    #[test]
    fn debug_never_shows_secret_values() {
        let caps = Capabilities {
            env: vec![("MAIL_API_KEY".into(), "s3cr3t-value".into())],
            ..Capabilities::none()
        };
        let shown = format!("{caps:?}");
        assert!(shown.contains("MAIL_API_KEY"));
        assert!(!shown.contains("s3cr3t-value"));
    }
}
