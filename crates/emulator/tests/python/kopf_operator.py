"""A minimal Kopf operator for `widgets.example.com`, run by `tests/third_party.rs` against a kactor emulator.

    python -m kopf run --standalone -A --verbose kopf_operator.py

Kopf keeps each handler's result in `status.<handler id>` and guards the object with its finalizer
`kopf.zalando.org/KopfFinalizerMarker`. The create handler also posts an Event; the delete handler
leaves a ConfigMap `<name>-deleted` behind, so that the test can see it ran after the Widget is gone.
"""

import kopf
import kubernetes

GROUP, VERSION, PLURAL = "example.com", "v1", "widgets"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    # A quick turnaround for a test: short backoffs and no long-lived idle connections.
    settings.watching.server_timeout = 30
    settings.watching.client_timeout = 40
    settings.networking.request_timeout = 20
    settings.batching.idle_timeout = 0.2
    settings.batching.batch_window = 0.05
    kubernetes.config.load_kube_config()


@kopf.on.create(GROUP, VERSION, PLURAL)
def create_fn(body, spec, name, logger, **_):
    logger.info(f"create_fn: {name} has size {spec.get('size')}")
    # A Kubernetes Event about the Widget, posted by Kopf in the background.
    kopf.info(body, reason="WidgetCreated", message=f"created {name}")
    return {"message": f"created {name}", "size": spec.get("size")}


@kopf.on.update(GROUP, VERSION, PLURAL)
def update_fn(old, new, diff, name, logger, **_):
    logger.info(f"update_fn: {name} changed: {list(diff)}")
    return {"message": f"updated {name}", "size": new.get("spec", {}).get("size")}


@kopf.on.delete(GROUP, VERSION, PLURAL)
def delete_fn(spec, name, namespace, logger, **_):
    marker = kubernetes.client.V1ConfigMap(
        metadata=kubernetes.client.V1ObjectMeta(
            name=f"{name}-deleted", labels={"kactor.test/marker": "delete"}
        ),
        data={"widget": name, "size": str(spec.get("size"))},
    )
    kubernetes.client.CoreV1Api().create_namespaced_config_map(namespace, marker)
    logger.info(f"delete_fn: {name} deleted; marker written")
    return {"message": f"deleted {name}"}
