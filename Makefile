# bdnvol developer targets. `make test` is what CI runs.
GO ?= go
BIN ?= bin/bdnvol
DEMO ?= $(CURDIR)/.demo

.PHONY: build test check vet unit e2e fuzz bench demo clean cosign cluster-tools cluster-deps image image-push deploy-manifests check-manifests release-check

build:
	$(GO) build -o $(BIN) ./cmd/bdnvol

vet:
	@test -z "$$(gofmt -l cmd pkg internal e2e)" || (echo "gofmt needed:"; gofmt -l cmd pkg internal e2e; exit 1)
	$(GO) vet ./...
	GOOS=darwin GOARCH=arm64 $(GO) vet ./...
	cd e2e && $(GO) vet ./...

# Every package that starts goroutines (or hands work to a pool) runs once
# more under the race detector: the push and pull engines, the format (its
# piece prefetch and metadata uploads), the stat cache, the chunk cache, the
# lazy reader, mounts, warming, the CSI plugin, the transport, copies,
# sources, versions, retention, jobs, ModelPack, oci-archives, metrics, the
# peer tier, the cluster client, warm state and the progress and signal helpers. pkg/push alone takes about 4.5 minutes
# and pkg/layout 1.5 on 2 shared cores (pkg/lazy 75-107 s).
RACE_PKGS ?= ./pkg/push/... ./pkg/pull/... ./pkg/layout/... ./pkg/statcache/... ./pkg/chunkcache/... \
	./pkg/lazy/... ./pkg/mounts/... ./pkg/warm/... ./pkg/csi/... ./pkg/oci/... ./pkg/replicate/... \
	./pkg/source/... ./pkg/versions/... ./pkg/retention/... ./pkg/jobs/... ./pkg/modelpack/... \
	./pkg/ociarchive/... ./pkg/metrics/... ./pkg/peer/... ./pkg/clusterpeers/... ./pkg/warmstate/... ./pkg/kubeclient/... ./pkg/kuberefs/... \
	./internal/progress/... ./internal/signals/... ./internal/sha2x/...

unit:
	$(GO) test -count=1 ./...
	$(GO) test -race -count=1 $(RACE_PKGS)

# Short fuzz runs of the parsers that read untrusted input, and of pull into a
# directory with planted links (an honest push, and a layout built from the
# fuzzer's bytes). Budgets are counts of executions (about 5 s each here), not
# durations: a -fuzztime duration races Go's fuzz coordinator at the deadline
# and fails with a bare "context deadline exceeded" on a loaded machine
# (go.dev/issue/75804, fixed in Go 1.27).
fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzDecodeIndex$$' -fuzztime=15000x -fuzzminimizetime=50x ./pkg/layout
	$(GO) test -run='^$$' -fuzz='^FuzzDecodeIndexV2$$' -fuzztime=15000x -fuzzminimizetime=50x ./pkg/layout
	$(GO) test -run='^$$' -fuzz='^FuzzDecodeDelta$$' -fuzztime=20000x -fuzzminimizetime=50x ./pkg/layout
	$(GO) test -run='^$$' -fuzz=FuzzSafetensorsHeader -fuzztime=20000x -fuzzminimizetime=50x ./pkg/tensorheader
	$(GO) test -run='^$$' -fuzz=FuzzGGUFHeader -fuzztime=20000x -fuzzminimizetime=50x ./pkg/tensorheader
	$(GO) test -run='^$$' -fuzz=FuzzPullPlanted -fuzztime=300x -fuzzminimizetime=50x ./pkg/pull
	$(GO) test -run='^$$' -fuzz=FuzzParseRef -fuzztime=30000x -fuzzminimizetime=50x ./pkg/oci
	$(GO) test -run='^$$' -fuzz=FuzzParseHostsConfig -fuzztime=30000x -fuzzminimizetime=50x ./pkg/oci
	$(GO) test -run='^$$' -fuzz=FuzzParseManifest -fuzztime=20000x -fuzzminimizetime=50x ./pkg/modelpack
	$(GO) test -run='^$$' -fuzz=FuzzBuildTar -fuzztime=10000x -fuzzminimizetime=50x ./pkg/modelpack
	$(GO) test -run='^$$' -fuzz=FuzzExtract -fuzztime=3000x -fuzzminimizetime=50x ./pkg/ociarchive
	$(GO) test -run='^$$' -fuzz=FuzzOpenLayout -fuzztime=1200x -fuzzminimizetime=50x ./pkg/layout
	$(GO) test -run='^$$' -fuzz='^FuzzPullLayout$$' -fuzztime=1200x -fuzzminimizetime=50x ./pkg/pull
	$(GO) test -run='^$$' -fuzz=FuzzSHA2x -fuzztime=20000x -fuzzminimizetime=50x ./internal/sha2x

# The cosign CLI the signature e2e tests run against, installed once into a
# cache directory that later runs reuse (keep COSIGN_VERSION in step with
# CosignVersion in e2e/signature_test.go).
COSIGN_VERSION ?= v2.6.5
TOOLS ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/bdnvol-tools
COSIGN = $(TOOLS)/cosign-$(COSIGN_VERSION)/cosign

cosign: $(COSIGN)

$(COSIGN):
	cd / && GOBIN=$(dir $(COSIGN)) GOFLAGS= GOWORK=off $(GO) install github.com/sigstore/cosign/v2/cmd/cosign@$(COSIGN_VERSION)

# The Kubernetes and etcd binaries the cluster tests run, built once from the
# wrapper module internal/tools/k8sbuild (its go.mod holds the versions) into
# cache directories keyed by version, which later runs reuse. The first build
# takes 15-30 minutes on 2 cores and about 2 GiB of memory.
K8SBUILD = internal/tools/k8sbuild
K8S_VERSION := $(shell sed -n 's/^[[:space:]]*k8s.io\/kubernetes \(v[^ ]*\).*$$/\1/p' $(K8SBUILD)/go.mod)
ETCD_VERSION := $(shell sed -n 's/^[[:space:]]*go.etcd.io\/etcd\/server\/v3 \(v[^ ]*\).*$$/\1/p' $(K8SBUILD)/go.mod)
K8S_TOOLS = $(TOOLS)/kubernetes-$(K8S_VERSION)
ETCD_TOOLS = $(TOOLS)/etcd-$(ETCD_VERSION)
K8S_CMDS = $(addprefix k8s.io/kubernetes/cmd/,kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
K8S_MINOR = $(word 2,$(subst ., ,$(K8S_VERSION)))
K8S_LDFLAGS = -s -w $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version,\
	-X $(p).gitVersion=$(K8S_VERSION) -X $(p).gitMajor=1 -X $(p).gitMinor=$(K8S_MINOR) -X $(p).gitTreeState=clean)
K8SGO = cd $(K8SBUILD) && CGO_ENABLED=0 GOFLAGS=-trimpath GOWORK=off nice -n 10 $(GO)

cluster-tools: $(K8S_TOOLS)/kubectl $(ETCD_TOOLS)/etcd

$(K8S_TOOLS)/kubectl:
	rm -rf $(K8S_TOOLS).tmp && mkdir -p $(K8S_TOOLS).tmp
	$(K8SGO) build -ldflags '$(K8S_LDFLAGS)' -o $(K8S_TOOLS).tmp/ $(K8S_CMDS)
	rm -rf $(K8S_TOOLS) && mv $(K8S_TOOLS).tmp $(K8S_TOOLS)

$(ETCD_TOOLS)/etcd:
	rm -rf $(ETCD_TOOLS).tmp && mkdir -p $(ETCD_TOOLS).tmp
	$(K8SGO) build -ldflags '-s -w' -o $(ETCD_TOOLS).tmp/etcd go.etcd.io/etcd/server/v3
	rm -rf $(ETCD_TOOLS) && mv $(ETCD_TOOLS).tmp $(ETCD_TOOLS)

# What the cluster tests need from Debian: a container runtime, and busybox
# for the test pods' image.
cluster-deps:
	@command -v containerd >/dev/null && command -v runc >/dev/null && test -x /bin/busybox || { \
		SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq containerd runc busybox-static >/dev/null; }

e2e: $(COSIGN) cluster-tools cluster-deps
	cd e2e && BDNVOL_COSIGN=$(COSIGN) CI=$${CI:-true} $(GO) test -count=1 -timeout 40m ./...

# The inner loop: vet and the unit tests (no race run, no fuzzing, no
# end-to-end tests), a few minutes.
check: vet
	$(GO) test -count=1 ./...

# Unit tests first, then vet, fuzz and the end-to-end tests. The image pin in
# deploy/ is a release step (make release-check), not part of the inner loop:
# the e2e tests check that every manifest is well-formed and pinned by digest.
test: unit vet fuzz e2e

# Before a release (goreleaser's before hook): deploy/ must pin the image this
# source builds; make deploy-manifests re-pins it.
release-check: check-manifests

bench:
	bash bench/bench.sh && bash bench/dataset.sh && bash bench/mount.sh && BENCH_LINK=1 bash bench/mount.sh && bash bench/warm.sh && BENCH_PAUSE=25ms bash bench/profile.sh && bash bench/warmstate.sh && bash bench/fleet.sh && bash bench/delta.sh

# The main job on generated sample data, against the embedded OCI-layout
# default: seal a small model, change it, push again, pull it back, compare.
demo: build
	rm -rf $(DEMO) && mkdir -p $(DEMO)
	cd e2e && $(GO) run ./cmd/synth -q -out $(DEMO)/model -size 64MiB -shards 2
	cd e2e && $(GO) run ./cmd/synth -q -finetune $(DEMO)/model -out $(DEMO)/model-ft -fraction 0.3 > /dev/null
	$(BIN) push oci:$(DEMO)/volumes:v1 $(DEMO)/model
	$(BIN) push oci:$(DEMO)/volumes:v2 $(DEMO)/model-ft --tag latest
	$(BIN) pull oci:$(DEMO)/volumes:v2 $(DEMO)/pulled
	diff -r $(DEMO)/model-ft $(DEMO)/pulled && echo "demo: pulled version is bit-identical"

# The container image, built without a container runtime: static binaries
# for $(PLATFORMS) on an empty base, an OCI layout in dist/image, the index
# digest on stdout. Same source and Go version, same digest.
VERSION ?= dev
PLATFORMS ?= linux/amd64,linux/arm64
MKIMAGE = $(GO) run ./internal/tools/mkimage -version $(VERSION) -platforms $(PLATFORMS)

image:
	$(MKIMAGE) -out dist/image

# make image-push IMAGE=host/repo:tag
image-push:
	@test -n "$(IMAGE)" || (echo "usage: make image-push IMAGE=host/repo:tag"; exit 1)
	$(MKIMAGE) -out dist/image -push $(IMAGE)

# Pin the bdnvol image in the Helm chart's values.yaml to the digest make image
# gives (IMAGE_REPO=host/repo also replaces the repository), then write
# deploy/kubernetes/*.yaml from the chart: the chart is the one source.
deploy-manifests:
	$(MKIMAGE) -out dist/image -manifests deploy/helm/bdnvol-csi $(if $(IMAGE_REPO),-image-repo $(IMAGE_REPO))
	cd e2e && $(GO) run ./cmd/manifests

# Fail unless the chart and deploy/kubernetes pin the image this source
# builds, and deploy/kubernetes is what the chart renders.
check-manifests:
	$(MKIMAGE) -out dist/image -check deploy/helm/bdnvol-csi
	$(MKIMAGE) -out dist/image -check deploy/kubernetes
	cd e2e && $(GO) run ./cmd/manifests -check

clean:
	rm -rf bin dist $(DEMO)
