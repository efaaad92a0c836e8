//! Name resolution for outbound requests, with the address policy applied
//! to every answer.
//!
//! reqwest connects to exactly the addresses a resolver returns, so
//! checking them here closes the DNS-rebinding window: a name is resolved
//! once per connection, the answers are judged, and the connection goes to
//! a judged answer, never to a second lookup's. A name with any forbidden
//! answer is refused outright.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use hickory_resolver::TokioResolver;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use super::policy::{AddressClass, AddressPolicy};

/// A refusal by the address policy, recognisable in reqwest's error chain.
#[derive(Debug, Clone, thiserror::Error)]
#[error("`{host}` resolves to {ip} ({}), which this node does not allow", class.label())]
pub struct AddressRefused {
    /// The name.
    pub host: String,
    /// The forbidden answer.
    pub ip: IpAddr,
    /// Why it is forbidden.
    pub class: AddressClass,
}

/// Where names are looked up.
enum Dns {
    /// The system's resolver (`getaddrinfo`: `/etc/hosts`, nsswitch).
    System,
    /// Configured DNS servers (`[egress] nameservers`).
    Servers(Box<TokioResolver>),
}

/// A reqwest resolver that lets through only allowed addresses.
pub(super) struct PolicyResolver {
    policy: Arc<AddressPolicy>,
    dns: Arc<Dns>,
}

impl PolicyResolver {
    /// Resolve with the system's resolver, or with `nameservers` if any.
    pub(super) fn new(policy: Arc<AddressPolicy>, nameservers: &[SocketAddr]) -> Self {
        let dns = if nameservers.is_empty() {
            Dns::System
        } else {
            use hickory_resolver::config::{
                NameServerConfig, NameServerConfigGroup, ResolverConfig, ResolverOpts,
            };
            use hickory_resolver::name_server::TokioConnectionProvider;
            use hickory_resolver::proto::xfer::Protocol;
            let mut group = NameServerConfigGroup::new();
            for addr in nameservers {
                group.push(NameServerConfig::new(*addr, Protocol::Udp));
            }
            let mut opts = ResolverOpts::default();
            // Answers are judged per connection; a cached answer would be
            // judged again anyway, but a fresh one is what a rebinding
            // attacker would change, so do not hide it behind a cache.
            opts.cache_size = 0;
            let resolver = hickory_resolver::Resolver::builder_with_config(
                ResolverConfig::from_parts(None, Vec::new(), group),
                TokioConnectionProvider::default(),
            )
            .with_options(opts)
            .build();
            Dns::Servers(Box::new(resolver))
        };
        Self {
            policy,
            dns: Arc::new(dns),
        }
    }
}

impl Resolve for PolicyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        let policy = self.policy.clone();
        let dns = self.dns.clone();
        Box::pin(async move {
            let answers: Vec<IpAddr> = match &*dns {
                Dns::System => tokio::net::lookup_host((host.as_str(), 0))
                    .await?
                    .map(|a| a.ip())
                    .collect(),
                Dns::Servers(r) => r.lookup_ip(host.as_str()).await?.iter().collect(),
            };
            check(&policy, &host, &answers)?;
            let addrs: Addrs = Box::new(answers.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

/// Every answer must be allowed.
pub(super) fn check(
    policy: &AddressPolicy,
    host: &str,
    answers: &[IpAddr],
) -> Result<(), AddressRefused> {
    for ip in answers {
        if let Err(class) = policy.check(*ip) {
            return Err(AddressRefused {
                host: host.to_owned(),
                ip: *ip,
                class,
            });
        }
    }
    Ok(())
}
