#!/usr/bin/env bash
# Refreshes the vendored .proto files of the built-in kinds whose protobuf request bodies the emulator
# decodes (src/protobuf.rs): from the Go module proxy, at the Kubernetes version the real test server
# is built at (crates/testenv), verbatim: the comments are the API's documentation, which the
# emulator's OpenAPI documents carry for `kubectl explain`. Apache-2.0, the Kubernetes Authors.
#
#   crates/emulator/protos/refresh.sh v0.37.2
set -euo pipefail
version="${1:?usage: refresh.sh <k8s.io/api version, e.g. v0.37.2>}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
proxy="${GOPROXY:-https://proxy.golang.org}"
proxy="${proxy%%,*}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

api=(core/v1 apps/v1 batch/v1 rbac/v1 networking/v1 policy/v1 scheduling/v1 scheduling/v1alpha3
     authentication/v1 authorization/v1 autoscaling/v1 coordination/v1)
machinery=(pkg/apis/meta/v1 pkg/runtime pkg/runtime/schema pkg/util/intstr pkg/api/resource)

for module in api apimachinery; do
    curl -sfL -o "$work/$module.zip" "$proxy/k8s.io/$module/@v/$version.zip"
    (cd "$work" && unzip -q "$module.zip" '*.proto')
done
rm -rf "$here/k8s.io"
for package in "${api[@]}"; do
    mkdir -p "$here/k8s.io/api/$package"
    cp "$work/k8s.io/api@$version/$package/generated.proto" "$here/k8s.io/api/$package/generated.proto"
done
for package in "${machinery[@]}"; do
    mkdir -p "$here/k8s.io/apimachinery/$package"
    cp "$work/k8s.io/apimachinery@$version/$package/generated.proto" \
        "$here/k8s.io/apimachinery/$package/generated.proto"
done
echo "$version" > "$here/VERSION"
# The embedded Go structs (`json:",inline"`, or `json:""`): src/protobuf.rs's INLINE must list these.
echo "inline fields (compare with INLINE in src/protobuf.rs):"
(cd "$work" && unzip -q -o api.zip '*/types.go')
for package in "${api[@]}"; do
    awk '/^type [A-Z][A-Za-z0-9]* struct/ { s = $2 }
         /^\t\*?[A-Za-z.]+ `json:"(,inline)?"/ && !/TypeMeta/ { print "  " s " " $0 }' \
        "$work/k8s.io/api@$version/$package/types.go"
done
