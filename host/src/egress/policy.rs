//! Who outbound requests may reach: host patterns (the per-type allow-list
//! and each secret's hosts) and the address policy applied after DNS.
//!
//! Addresses are judged after resolution, and the checked address is the
//! one connected to (see `resolve.rs`): a name cannot pass the check as one
//! address and connect as another. Host names are parsed by the WHATWG URL
//! rules first, so `2130706433`, `0x7f.1` and `0177.0.0.1` are the IPv4
//! address 127.0.0.1 before any check sees them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// A host pattern: `api.example.com` (that host), `*.example.com` (any
/// host under `example.com`, not `example.com` itself), or an IP literal
/// (`127.0.0.2`, `[::1]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// Exactly this host name (lowercase).
    Exact(String),
    /// Any host name ending in `.` + this suffix.
    Subdomains(String),
    /// This address.
    Ip(IpAddr),
}

/// Longest host name (RFC 1035).
const MAX_HOST: usize = 253;

impl HostPattern {
    /// Parse a pattern; the error says what is wrong with it.
    pub fn parse(pattern: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("host pattern `{pattern}` {why}");
        let p = pattern.trim();
        if p.is_empty() {
            return Err(bad("is empty"));
        }
        if let Some(v6) = p.strip_prefix('[').and_then(|p| p.strip_suffix(']')) {
            return v6
                .parse::<Ipv6Addr>()
                .map(|ip| Self::Ip(IpAddr::V6(ip)))
                .map_err(|_| bad("is not an IPv6 address"));
        }
        if let Ok(ip) = p.parse::<Ipv4Addr>() {
            return Ok(Self::Ip(IpAddr::V4(ip)));
        }
        let (suffix, name) = match p.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, p),
        };
        let name = name.to_ascii_lowercase();
        if name.len() > MAX_HOST {
            return Err(bad("is longer than 253 characters"));
        }
        for label in name.split('.') {
            if label.is_empty() || label.len() > 63 {
                return Err(bad(
                    "must be a host name such as api.example.com or *.example.com \
                     (no scheme, port, path or empty labels)",
                ));
            }
            if !label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                || label.starts_with('-')
                || label.ends_with('-')
            {
                return Err(bad(
                    "may only hold letters, digits, dots and inner hyphens \
                     (one leading `*.` for subdomains)",
                ));
            }
        }
        // A numeric last label would make it an IPv4 address to the URL
        // parser (`0x7f.1`): refuse the ambiguity.
        if name
            .rsplit('.')
            .next()
            .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()) || l.starts_with("0x"))
        {
            return Err(bad("ends in a numeric label (write an IP address plainly)"));
        }
        Ok(if suffix {
            Self::Subdomains(name)
        } else {
            Self::Exact(name)
        })
    }

    /// Whether `host` (as parsed from a URL) matches.
    pub fn matches(&self, host: &url::Host<&str>) -> bool {
        match (self, host) {
            (Self::Exact(p), url::Host::Domain(d)) => p.eq_ignore_ascii_case(d),
            (Self::Subdomains(p), url::Host::Domain(d)) => {
                let d = d.to_ascii_lowercase();
                d.len() > p.len() + 1
                    && d.ends_with(p.as_str())
                    && d.as_bytes()[d.len() - p.len() - 1] == b'.'
            }
            (Self::Ip(IpAddr::V4(p)), url::Host::Ipv4(a)) => p == a,
            (Self::Ip(IpAddr::V6(p)), url::Host::Ipv6(a)) => p == a,
            _ => false,
        }
    }
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exact(h) => f.write_str(h),
            Self::Subdomains(h) => write!(f, "*.{h}"),
            Self::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Self::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// Parse a list of host patterns (`what` names the list in errors).
pub fn parse_patterns(what: &str, patterns: &[String]) -> Result<Vec<HostPattern>, String> {
    patterns
        .iter()
        .map(|p| HostPattern::parse(p).map_err(|e| format!("{what}: {e}")))
        .collect()
}

/// Whether any of `patterns` matches `host`.
pub fn any_matches(patterns: &[HostPattern], host: &url::Host<&str>) -> bool {
    patterns.iter().any(|p| p.matches(host))
}

/// Why an address may not be reached. The name is what the error shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    /// 127.0.0.0/8, ::1.
    Loopback,
    /// 10/8, 172.16/12, 192.168/16, fc00::/7.
    Private,
    /// 169.254/16, fe80::/10 (cloud metadata services live here).
    LinkLocal,
    /// 100.64/10 (carrier-grade NAT).
    SharedAddressSpace,
    /// 224/4, ff00::/8.
    Multicast,
    /// 0.0.0.0/8, ::.
    Unspecified,
    /// 255.255.255.255.
    Broadcast,
    /// 169.254.169.254, fd00:ec2::254: cloud instance metadata.
    Metadata,
    /// ::ffff:0:0/96, ::/96 (IPv4 inside IPv6), 64:ff9b::/96 (NAT64),
    /// 2002::/16 (6to4), 2001::/32 (Teredo): an IPv4 address in disguise.
    EmbeddedIpv4,
    /// 192.0.0/24, 198.18/15, 240/4, documentation and benchmark ranges,
    /// 100::/64, 2001:db8::/32, fec0::/10.
    Reserved,
}

impl AddressClass {
    /// How errors name it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Loopback => "loopback",
            Self::Private => "private",
            Self::LinkLocal => "link-local",
            Self::SharedAddressSpace => "shared (CGNAT)",
            Self::Multicast => "multicast",
            Self::Unspecified => "unspecified",
            Self::Broadcast => "broadcast",
            Self::Metadata => "cloud metadata",
            Self::EmbeddedIpv4 => "IPv4-embedding IPv6",
            Self::Reserved => "reserved",
        }
    }
}

/// The class of an address that is not a public unicast address, or
/// `None` for one that is.
pub fn classify(ip: IpAddr) -> Option<AddressClass> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<AddressClass> {
    let o = ip.octets();
    Some(match o {
        [169, 254, 169, 254] => AddressClass::Metadata,
        [0, ..] => AddressClass::Unspecified,
        [127, ..] => AddressClass::Loopback,
        [10, ..] | [172, 16..=31, ..] | [192, 168, ..] => AddressClass::Private,
        [169, 254, ..] => AddressClass::LinkLocal,
        [100, 64..=127, ..] => AddressClass::SharedAddressSpace,
        [224..=239, ..] => AddressClass::Multicast,
        [255, 255, 255, 255] => AddressClass::Broadcast,
        [192, 0, 0, _]
        | [192, 0, 2, _]
        | [198, 18..=19, ..]
        | [198, 51, 100, _]
        | [203, 0, 113, _]
        | [240..=255, ..] => AddressClass::Reserved,
        _ => return None,
    })
}

fn classify_v6(ip: Ipv6Addr) -> Option<AddressClass> {
    let s = ip.segments();
    if ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
        return Some(AddressClass::Metadata);
    }
    if ip.is_unspecified() {
        return Some(AddressClass::Unspecified);
    }
    if ip.is_loopback() {
        return Some(AddressClass::Loopback);
    }
    Some(match s {
        // ::ffff:a.b.c.d (mapped) and ::a.b.c.d (compatible, deprecated).
        // ::ffff:0:a.b.c.d (translated), too.
        [0, 0, 0, 0, 0, 0xffff, ..] | [0, 0, 0, 0, 0, 0, ..] | [0, 0, 0, 0, 0xffff, 0, ..] => {
            AddressClass::EmbeddedIpv4
        }
        // NAT64: the well-known prefix and the local-use 64:ff9b:1::/48.
        [0x64, 0xff9b, 0, 0, 0, 0, ..] | [0x64, 0xff9b, 1, ..] | [0x2002, ..] | [0x2001, 0, ..] => {
            AddressClass::EmbeddedIpv4
        }
        [0xfc00..=0xfdff, ..] => AddressClass::Private,
        [0xfe80..=0xfebf, ..] => AddressClass::LinkLocal,
        [0xfec0..=0xfeff, ..] | [0x100, 0, 0, 0, ..] | [0x2001, 0xdb8, ..] => {
            AddressClass::Reserved
        }
        [0xff00..=0xffff, ..] => AddressClass::Multicast,
        _ => return None,
    })
}

/// Which addresses outbound requests may reach: public unicast addresses,
/// plus the ranges the node's config opens (`[egress] allow_private`).
#[derive(Debug, Clone, Default)]
pub struct AddressPolicy {
    allow: Vec<IpNet>,
}

impl AddressPolicy {
    /// A policy opening the `allow` ranges (CIDR, or a bare address); the
    /// error names the entry (the caller names the setting).
    pub fn new(allow: &[String]) -> Result<Self, String> {
        let allow = allow
            .iter()
            .map(|a| {
                a.parse::<IpNet>()
                    .or_else(|_| a.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| format!("`{a}` is not an address or CIDR range"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { allow })
    }

    /// Whether `ip` may be connected to; the error names its class.
    pub fn check(&self, ip: IpAddr) -> Result<(), AddressClass> {
        match classify(ip) {
            None => Ok(()),
            Some(_) if self.allow.iter().any(|n| n.contains(&ip)) => Ok(()),
            Some(class) => Err(class),
        }
    }
}

/// Whether `url` holds `{{secret:`, as written or percent-encoded (a URL
/// parser encodes braces in a path).
pub fn has_secret_placeholder(url: &str) -> bool {
    holds_secret_placeholder(url.as_bytes())
}

/// Whether `text` holds something written as a `{{secret:` placeholder
/// where none is substituted: in any ASCII case (`{{SECRET:K}}`), with
/// blanks inside the braces (`{{ secret: K }}`, a form's `+`), or
/// percent-encoded (`%7B%7Bsecret%3AK%7D%7D`, what a form or URL encoder
/// makes of one). Each went out as written, naming the secret.
pub fn holds_secret_placeholder(text: &[u8]) -> bool {
    let decoded = std::borrow::Cow::<[u8]>::from(percent_encoding::percent_decode(text));
    let text = &*decoded;
    (0..text.len().saturating_sub(1))
        .any(|i| text[i..].starts_with(b"{{") && opens_secret_placeholder(&text[i + 2..]))
}

/// Whether `rest`, what follows a `{{`, opens a secret placeholder, given
/// or taken case and a few blanks: `secret:`, ` SECRET :`.
pub fn opens_secret_placeholder(rest: &[u8]) -> bool {
    // Its start as written or percent-encoded in part (`{{secret%3AK}}`).
    let head: Vec<u8> = percent_encoding::percent_decode(&rest[..rest.len().min(48)]).collect();
    let rest = head.as_slice();
    // A few blanks, not any number: a run of `{{` and blanks stays linear.
    const BLANKS: usize = 4;
    let blanks = |at: &[u8]| {
        at.iter()
            .take(BLANKS + 1)
            .take_while(|b| b.is_ascii_whitespace() || **b == b'+')
            .count()
    };
    let rest = &rest[blanks(rest)..];
    let Some(word) = rest.get(..6) else {
        return false;
    };
    let rest = &rest[6..];
    word.eq_ignore_ascii_case(b"secret") && rest.get(blanks(rest)) == Some(&b':')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(url: &str) -> url::Host<String> {
        url::Url::parse(url).unwrap().host().unwrap().to_owned()
    }

    fn matches(pattern: &str, url: &str) -> bool {
        let h = host(url);
        let h = match &h {
            url::Host::Domain(d) => url::Host::Domain(d.as_str()),
            url::Host::Ipv4(a) => url::Host::Ipv4(*a),
            url::Host::Ipv6(a) => url::Host::Ipv6(*a),
        };
        HostPattern::parse(pattern).unwrap().matches(&h)
    }

    #[test]
    fn patterns_match_exact_hosts_and_subdomains() {
        assert!(matches("api.example.com", "https://API.example.com/x"));
        assert!(!matches("api.example.com", "https://example.com/"));
        assert!(!matches(
            "api.example.com",
            "https://api.example.com.evil.net/"
        ));
        assert!(matches("*.example.org", "https://a.example.org/"));
        assert!(matches("*.example.org", "https://a.b.example.org/"));
        assert!(!matches("*.example.org", "https://example.org/"));
        assert!(!matches("*.example.org", "https://badexample.org/"));
        assert!(matches("127.0.0.2", "https://127.0.0.2:8443/"));
        assert!(matches("[::1]", "http://[::1]/"));
        assert!(!matches("127.0.0.2", "https://127.0.0.1/"));
    }

    #[test]
    fn malformed_patterns_are_refused() {
        for bad in [
            "",
            "https://api.example.com",
            "api.example.com/v1",
            "api.example.com:443",
            "*",
            "*.",
            "a..b",
            "-a.com",
            "a-.com",
            "a_b.com",
            "**.example.com",
            "api.*.com",
            "0x7f.1",
            "10.0.0",
            "[::1",
            "[nope]",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn ipv4_spellings_normalize_before_any_check() {
        for url in [
            "http://2130706433/",
            "http://0x7f.1/",
            "http://0177.0.0.1/",
            "http://127.1/",
            "http://0x7f000001/",
        ] {
            assert_eq!(
                host(url),
                url::Host::<String>::Ipv4(Ipv4Addr::LOCALHOST),
                "{url} is not 127.0.0.1 to the URL parser"
            );
        }
    }

    #[test]
    fn non_public_addresses_are_classified() {
        let c = |s: &str| classify(s.parse().unwrap());
        use AddressClass::*;
        for (ip, class) in [
            ("127.0.0.1", Loopback),
            ("127.255.0.9", Loopback),
            ("::1", Loopback),
            ("0.0.0.0", Unspecified),
            ("::", Unspecified),
            ("10.1.2.3", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.168.1.1", Private),
            ("fd12::1", Private),
            ("169.254.169.254", Metadata),
            ("fd00:ec2::254", Metadata),
            ("169.254.1.1", LinkLocal),
            ("fe80::1", LinkLocal),
            ("100.64.0.1", SharedAddressSpace),
            ("100.127.255.255", SharedAddressSpace),
            ("224.0.0.1", Multicast),
            ("ff02::1", Multicast),
            ("255.255.255.255", Broadcast),
            ("::ffff:127.0.0.1", EmbeddedIpv4),
            ("::ffff:8.8.8.8", EmbeddedIpv4),
            ("::127.0.0.1", EmbeddedIpv4),
            ("64:ff9b::a00:1", EmbeddedIpv4),
            ("64:ff9b:1::a00:1", EmbeddedIpv4),
            ("::ffff:0:7f00:1", EmbeddedIpv4),
            ("2002:7f00:1::", EmbeddedIpv4),
            ("2001:0:4136:e378::", EmbeddedIpv4),
            ("192.0.2.1", Reserved),
            ("198.18.0.1", Reserved),
            ("240.0.0.1", Reserved),
            ("2001:db8::1", Reserved),
        ] {
            assert_eq!(c(ip), Some(class), "{ip}");
        }
        for public in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
        ] {
            assert_eq!(c(public), None, "{public}");
        }
    }

    #[test]
    fn allow_private_opens_only_the_listed_ranges() {
        let p = AddressPolicy::new(&["127.0.0.2/32".into(), "10.9.0.0/16".into()]).unwrap();
        assert_eq!(p.check("127.0.0.2".parse().unwrap()), Ok(()));
        assert_eq!(p.check("10.9.1.1".parse().unwrap()), Ok(()));
        assert_eq!(
            p.check("127.0.0.1".parse().unwrap()),
            Err(AddressClass::Loopback)
        );
        // The IPv4-mapped spelling of an allowed address is still refused.
        assert_eq!(
            p.check("::ffff:127.0.0.2".parse().unwrap()),
            Err(AddressClass::EmbeddedIpv4)
        );
        assert_eq!(p.check("8.8.8.8".parse().unwrap()), Ok(()));
        assert!(AddressPolicy::new(&["nope".into()]).is_err());
        assert!(AddressPolicy::new(&["127.0.0.1".into()]).is_ok());
    }

    #[test]
    fn placeholders_are_seen_however_they_are_written() {
        for text in [
            "{{secret:K}}",
            "x={{SECRET:K}}",
            "{{ secret:K }}",
            "{{secret :K}}",
            "{{\tSecret\n:K}}",
            "k=%7B%7Bsecret%3AK%7D%7D",
            "k=%7b%7b+secret%3aK%7d%7d",
            "{{{secret:K}}}",
            "{ {{{secret:K}}",
            "{{secret%3AK}}",
            "{{%20secret%3a K}}",
        ] {
            assert!(holds_secret_placeholder(text.as_bytes()), "{text}");
        }
        for text in [
            "",
            "{{",
            "{{secret",
            "{{secrets:K}}",
            "{{idempotency-key}}",
            "{secret:K}",
            "{{      secret:K}}",
            "secret:K",
            "%7B%7Bsecre",
        ] {
            assert!(!holds_secret_placeholder(text.as_bytes()), "{text}");
        }
        // Blanks are bounded: a run of openers and blanks stays linear.
        let long = "{{ ".repeat(100_000);
        assert!(!holds_secret_placeholder(long.as_bytes()));
    }
}
