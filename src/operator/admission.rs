//! The admission webhooks of an operator: its webhook server started before anything is watched
//! (so that the first objects are already validated), its configurations kept while it runs, and
//! withdrawn at the end of the graceful shutdown.

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
    let resources = discovery::scan(client).await?;
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
