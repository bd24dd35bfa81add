"""A minimal Kopf operator that peers with kactor, run by `tests/peering.rs` against the emulator.

    POD_ID=kopf-high python -m kopf run --priority 100 -A --peering default --verbose kopf_peer.py

It handles nothing of interest: it is there to write its keep-alive record into the cluster-wide
peering object `default`, and to pause (logging "Pausing operations in favour of ...") when a peer
with a higher priority is there.
"""

import kopf


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    # No long-lived idle connections in a test.
    settings.watching.server_timeout = 30
    settings.watching.client_timeout = 40
    settings.networking.request_timeout = 20


@kopf.on.event("configmaps")
def seen(name, logger, **_):
    logger.info(f"seen configmap {name}")
