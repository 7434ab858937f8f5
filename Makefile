# The targets a newcomer and CI use. `make test` is the test command.

GO ?= go
STATICCHECK_VERSION ?= v0.8.2

.PHONY: test lint unit unit-rest race bench-smoke build robustness image e2e-engines

build:
	$(GO) build -o bin/strata ./cmd/strata

# The container image: the static binary FROM scratch (deploy/Dockerfile),
# tagged $(IMAGE), built in $(IMAGE_DIR). deploy/compose.yaml runs three
# members from it, and deploy/compose_test.go builds it with this target.
#
# The binary links with cgo, as `go build` does wherever a C compiler is
# found and as every figure in docs/bench was measured: Pebble then keeps its
# block cache and memtables in C memory. Built without cgo, Pebble puts them
# in the Go heap, which the collector lets grow to twice what is live (YCSB
# B and C at 10^6 keys: peak RSS 380-486 against 249 MiB, docs/operations.md).
# It is linked statically against glibc; netgo and osusergo leave out
# glibc's resolver and user lookups, which would need its shared libraries.
IMAGE ?= strata:dev
IMAGE_DIR ?= bin/image
image:
	mkdir -p $(IMAGE_DIR)
	CGO_ENABLED=1 $(GO) build -trimpath -tags netgo,osusergo \
		-ldflags '-linkmode external -extldflags "-static"' \
		-o $(IMAGE_DIR)/strata-static ./cmd/strata
	docker build -q -t $(IMAGE) -f deploy/Dockerfile $(IMAGE_DIR)

lint:
	test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

# Packages whose state is shared between goroutines run under the race detector.
RACE_PKGS = ./node/... ./apply/... ./propose/... ./raftlog/... ./engine/... ./mvcc/... ./member/... ./transport/... ./snapshot/... ./maintenance/... ./logcompact/... ./watch ./lease/... ./auth/... ./server ./backup/... ./logger/... ./membership/...
race:
	$(GO) test -race -count=1 -timeout 30m $(RACE_PKGS)

# Every package that race does not run: with race, the whole module once.
# (`make unit` runs every package without the race detector.)
unit-rest:
	$(GO) test -count=1 -timeout 30m $$($(GO) list ./... | grep -vxF "$$($(GO) list $(RACE_PKGS))")

# The end-to-end package builds etcd, etcdctl, etcdutl and, on a cold cache,
# MinIO (about 4.5 minutes on 2 cores) inside its own run: go test's default
# 10-minute limit per package is too short for it.
unit:
	$(GO) test -count=1 -timeout 30m ./...

bench-smoke:
	cd bench && $(GO) test -count=1 ./...

# lint first: it compiles every package once and keeps both cores busy.
# Then the three test sets side by side. The end-to-end and bench packages
# spend most of their time waiting on real servers (elections, lease TTLs,
# restarts): in a clean run on the 2-core VM the cores were 2-35% busy
# through most of e2e and bench-smoke, and 90-99% through race, which now
# fills those waits. Each set's output is printed whole when it ends.
test: lint
	$(MAKE) --no-print-directory -j3 --output-sync=target unit-rest race bench-smoke

# etcd's robustness suite against strata, then against the real etcd (not part
# of `make test`: minutes long). tools/robustness/README.md says what it runs.
robustness:
	tools/robustness/run.sh both

# The end-to-end suite on each engine other than the default (Pebble runs it
# in `make test`): every strata member the harness starts, and every strata
# restore it runs, takes --engine from STRATA_E2E_ENGINE
# (internal/testutil/engine.go). Not part of `make test`: three more runs of
# the whole e2e package. E2E_RUN narrows it (go test -run), e.g.
# make e2e-engines E2E_RUN='TestLease|TestAuth'.
E2E_ENGINES ?= bbolt appendlog hybridlog
E2E_RUN ?= .
e2e-engines:
	fail=0; for e in $(E2E_ENGINES); do \
		echo "== e2e on $$e"; \
		STRATA_E2E_ENGINE=$$e $(GO) test -count=1 -timeout 60m -run '$(E2E_RUN)' ./e2e/ || fail=1; \
	done; exit $$fail
