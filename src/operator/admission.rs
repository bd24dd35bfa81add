//! The admission webhooks of an operator: its webhook server started before anything is watched
//! (so that the first objects are already validated), its configurations kept while it runs, and
//! withdrawn at the end of the graceful shutdown.

use std::time::Duration;

use kactor_webhooks::{Converter, Served, Webhooks};

use super::*;

/// Starts the webhook server for the operator's admission handlers, and (with
/// `settings.admission.managed`) writes the webhook configurations; None without admission
/// handlers.
pub(super) async fn start(operator: &Operator, client: &kube::Client) -> Result<Option<Webhooks>> {
    let registry = &operator.registry;
    let (handlers, conversions) = (&registry.admission_handlers, &registry.conversion_handlers);
    if handlers.is_empty() && conversions.is_empty() {
        return Ok(None);
    }
    let Some(server) = &operator.settings.admission.server else {
        let ids: Vec<String> = handlers
            .iter()
            .map(|h| h.admission.id.clone())
            .chain(
                conversions
                    .iter()
                    .map(|c| format!("{} {} to {}", c.selector.name, c.from, c.to)),
            )
            .collect();
        return Err(Error::NoWebhookServer(ids.join(", ")));
    };
    let selectors: Vec<&Selector> = handlers
        .iter()
        .map(|h| &h.selector)
        .chain(conversions.iter().map(|c| &c.selector))
        .collect();
    let resources = served_soon(client, &selectors, SERVED_PATIENCE).await?;
    let mut served = Vec::new();
    for handler in handlers {
        let resource = handler.selector.resolve(&resources)?.clone();
        served.push(Served {
            handler: handler.clone(),
            resource: Arc::new(resource),
        });
    }
    let mut converters = Vec::new();
    for handler in conversions {
        let resource = handler.selector.resolve(&resources)?.clone();
        converters.push(Converter {
            handler: handler.clone(),
            resource: Arc::new(resource),
        });
    }
    let webhooks = Webhooks::start(server, served, converters, client.clone()).await?;
    if let Some(managed) = &operator.settings.admission.managed {
        webhooks.configure(managed).await?;
        tracing::info!(configuration = %managed, "The webhook configurations point at this operator.");
    }
    Ok(Some(webhooks))
}

/// How long the webhooks wait at the start for a resource they serve to appear in discovery.
const SERVED_PATIENCE: Duration = Duration::from_secs(30);

/// What the cluster serves, once every exact selector (group, version and plural given) is among
/// it, or `patience` has passed. A CRD applied together with its operator (one `kubectl apply`)
/// is served a moment after it is created, and discovery shows it a moment later still: a webhook
/// must know its resource before it is configured, so it waits for it (the watches need not: they
/// start a resource's supervisor when it appears). Other selectors do not wait; a resource still
/// missing after `patience` is the caller's error to report, as at once without it.
async fn served_soon(
    client: &kube::Client,
    selectors: &[&Selector],
    patience: Duration,
) -> Result<Vec<Resource>> {
    let deadline = tokio::time::Instant::now() + patience;
    let mut pause = Duration::from_millis(100);
    let mut warned = false;
    loop {
        let resources = discovery::scan(client).await?;
        let missing = selectors.iter().find(|s| {
            s.exact
                && matches!(
                    s.resolve(&resources),
                    Err(discovery::ResolveError::NotFound { .. })
                )
        });
        let Some(missing) = missing else {
            return Ok(resources);
        };
        if tokio::time::Instant::now() + pause > deadline {
            return Ok(resources);
        }
        if !warned {
            tracing::warn!(resource = %missing, "an admission handler's resource is not served yet; waiting up to {}s for it", patience.as_secs());
            warned = true;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}
