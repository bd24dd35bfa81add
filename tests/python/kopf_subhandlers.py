"""A Kopf operator with sub-handlers, run by `tests/kopf.rs` to hand half-done sub-handlers over to
kactor, and to continue those kactor left.

    KOPF_ROLE=first python -m kopf run --standalone -A --verbose kopf_subhandlers.py

The create handler `create_fn` has two sub-handlers, `a` and `b` (ids `create_fn/a`, `create_fn/b`).
* `first`: `a` succeeds; `b` fails temporarily every time (3 s), so the creation stays half done
  until the test kills Kopf and kactor finishes it.
* `second`: Kopf continues what kactor left: `b` succeeds; `a` must not run again (kactor's
  success stands), and fails for good if it does.
Each result says who made it: `{"by": "kopf"}`.
"""

import os

import kopf

GROUP, VERSION, PLURAL = "example.com", "v1", "widgets"
ROLE = os.environ["KOPF_ROLE"]


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    settings.watching.server_timeout = 30
    settings.watching.client_timeout = 40
    settings.networking.request_timeout = 20
    settings.batching.idle_timeout = 0.2
    settings.batching.batch_window = 0.05
    settings.posting.enabled = False


@kopf.on.create(GROUP, VERSION, PLURAL)
def create_fn(logger, **_):
    @kopf.subhandler(id="a")
    def a(**_):
        if ROLE == "second":
            raise kopf.PermanentError("a ran again after kactor's success")
        return {"by": "kopf"}

    @kopf.subhandler(id="b")
    def b(**_):
        if ROLE == "first":
            raise kopf.TemporaryError("left to kactor", delay=3)
        return {"by": "kopf"}

    logger.info(f"create_fn registered its sub-handlers ({ROLE})")
    return {"by": "kopf"}
