# bdnvol developer targets. `make test` is what CI runs.
GO ?= go
BIN ?= bin/bdnvol
DEMO ?= $(CURDIR)/.demo

.PHONY: build test vet unit e2e fuzz bench demo clean

build:
	$(GO) build -o $(BIN) ./cmd/bdnvol

vet:
	@test -z "$$(gofmt -l cmd pkg internal e2e)" || (echo "gofmt needed:"; gofmt -l cmd pkg internal e2e; exit 1)
	$(GO) vet ./...
	GOOS=darwin GOARCH=arm64 $(GO) vet ./...
	cd e2e && $(GO) vet ./...

unit:
	$(GO) test -count=1 ./...

# Short fuzz runs of the parsers that read untrusted input.
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzDecodeIndex -fuzztime=5s ./pkg/layout
	$(GO) test -run='^$$' -fuzz=FuzzSafetensorsHeader -fuzztime=5s ./pkg/layout
	$(GO) test -run='^$$' -fuzz=FuzzParseRef -fuzztime=5s ./pkg/oci
	$(GO) test -run='^$$' -fuzz=FuzzOpenLayout -fuzztime=5s -fuzzminimizetime=50x ./pkg/layout

e2e:
	cd e2e && CI=$${CI:-true} $(GO) test -count=1 -timeout 15m ./...

test: vet unit fuzz e2e

bench:
	bash bench/bench.sh && bash bench/mount.sh

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

clean:
	rm -rf bin $(DEMO)
