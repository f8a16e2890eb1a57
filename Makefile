# warmroute — the two commands a newcomer needs are `make run` and `make test`.
GO       ?= go
PKGS     ?= ./...
BENCHCOUNT ?= 6

.PHONY: run test build vet fmt bench-saar

## run: start warmroute on 127.0.0.1:30000 with embedded simulated workers (demo mode).
run:
	$(GO) run ./cmd/warmroute

## test: every test, with the race detector.
test:
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 $(PKGS)

build:
	mkdir -p bin
	$(GO) build -trimpath -o bin/ ./cmd/...

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -l -w $$(git ls-files '*.go')

## bench-saar: the SAAR policy matrix (21,600 turns per policy) and the live check through the real router.
bench-saar:
	$(GO) run ./cmd/saarmatrix -out bench/results
	$(GO) run ./cmd/saarlive -out bench/results
