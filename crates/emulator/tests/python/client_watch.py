"""Lists and watches Widgets and ConfigMaps with the official `kubernetes` Python client.

Run by `tests/third_party.rs` against a kactor emulator (KUBECONFIG points at it). It prints JSON lines
on stdout:

  {"phase": "listed", "widgets": [...], "widgets_unmatched": [...], "configmaps": [...], ...}
      once both lists are done and both watches are about to start: the test then makes its changes;
  {"watch": "widgets"|"configmaps", "type": "ADDED"|..., "name": ..., "resourceVersion": ..., ...}
      one line per watch event;
  {"watch": ..., "phase": "ended", "reason": "deleted"|"timeout"}
      when a watch saw its `--stop-widget` / `--stop-configmap` deleted, or timed out;
  {"phase": "done"}
      at the end.

Exit code 0 on success; anything else (an exception) prints a traceback on stderr.
"""

import argparse
import json
import sys
import threading

from kubernetes import client, config, watch

GROUP, VERSION, PLURAL = "example.com", "v1", "widgets"

_print_lock = threading.Lock()


def emit(**fields):
    with _print_lock:
        sys.stdout.write(json.dumps(fields, sort_keys=True) + "\n")
        sys.stdout.flush()


def names(items):
    return sorted(item["metadata"]["name"] for item in items)


def watch_widgets(api, args, resource_version, errors):
    try:
        stream = watch.Watch()
        reason = "timeout"
        for event in stream.stream(
            api.list_namespaced_custom_object,
            GROUP,
            VERSION,
            args.namespace,
            PLURAL,
            label_selector=args.selector,
            resource_version=resource_version,
            timeout_seconds=args.timeout,
            _request_timeout=args.timeout + 10,
        ):
            obj = event["object"]  # a dict for custom objects
            meta = obj["metadata"]
            emit(
                watch="widgets",
                type=event["type"],
                name=meta["name"],
                resourceVersion=meta["resourceVersion"],
                generation=meta.get("generation"),
                labels=meta.get("labels", {}),
                spec=obj.get("spec", {}),
            )
            if event["type"] == "DELETED" and meta["name"] == args.stop_widget:
                reason = "deleted"
                stream.stop()
        emit(watch="widgets", phase="ended", reason=reason)
    except Exception as error:  # noqa: BLE001 - reported to the test
        errors.append(f"widgets watch: {error!r}")
        raise


def watch_configmaps(core, args, resource_version, errors):
    try:
        stream = watch.Watch()
        reason = "timeout"
        for event in stream.stream(
            core.list_namespaced_config_map,
            args.namespace,
            label_selector=args.selector,
            resource_version=resource_version,
            timeout_seconds=args.timeout,
            _request_timeout=args.timeout + 10,
        ):
            cm = event["object"]  # a V1ConfigMap
            emit(
                watch="configmaps",
                type=event["type"],
                name=cm.metadata.name,
                resourceVersion=cm.metadata.resource_version,
                labels=cm.metadata.labels or {},
                data=cm.data or {},
            )
            if event["type"] == "DELETED" and cm.metadata.name == args.stop_configmap:
                reason = "deleted"
                stream.stop()
        emit(watch="configmaps", phase="ended", reason=reason)
    except Exception as error:  # noqa: BLE001 - reported to the test
        errors.append(f"configmaps watch: {error!r}")
        raise


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--selector", required=True, help="the label selector to list and watch with")
    parser.add_argument("--unmatched-selector", required=True, help="a selector that matches nothing")
    parser.add_argument("--stop-widget", required=True, help="end the Widget watch when this one is deleted")
    parser.add_argument(
        "--stop-configmap", required=True, help="end the ConfigMap watch when this one is deleted"
    )
    parser.add_argument("--timeout", type=int, default=30, help="watch timeoutSeconds")
    args = parser.parse_args()

    config.load_kube_config()
    version = client.VersionApi().get_code()
    api = client.CustomObjectsApi()
    core = client.CoreV1Api()

    widgets = api.list_namespaced_custom_object(
        GROUP, VERSION, args.namespace, PLURAL, label_selector=args.selector
    )
    unmatched = api.list_namespaced_custom_object(
        GROUP, VERSION, args.namespace, PLURAL, label_selector=args.unmatched_selector
    )
    configmaps = core.list_namespaced_config_map(args.namespace, label_selector=args.selector)
    configmaps_unmatched = core.list_namespaced_config_map(
        args.namespace, label_selector=args.unmatched_selector
    )
    # Each watch starts from its list's resourceVersion, as an informer does: nothing in between is lost.
    errors = []
    threads = [
        threading.Thread(
            target=watch_widgets,
            args=(api, args, widgets["metadata"]["resourceVersion"], errors),
        ),
        threading.Thread(
            target=watch_configmaps,
            args=(core, args, configmaps.metadata.resource_version, errors),
        ),
    ]
    for thread in threads:
        thread.start()
    emit(
        phase="listed",
        server=version.git_version,
        widgets=names(widgets["items"]),
        widgets_kind=widgets["kind"],
        widgets_unmatched=names(unmatched["items"]),
        configmaps=sorted(cm.metadata.name for cm in configmaps.items),
        configmaps_unmatched=sorted(cm.metadata.name for cm in configmaps_unmatched.items),
    )
    for thread in threads:
        thread.join(args.timeout + 20)
    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)
    emit(phase="done")


if __name__ == "__main__":
    main()
