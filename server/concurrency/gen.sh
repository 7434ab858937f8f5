#!/bin/sh
# Regenerates v3electionpb and v3lockpb from their .proto files. CI does not
# run this: the generated code is committed. Run it (go generate
# ./server/concurrency/) after editing a .proto, with the tools the
# committed code was generated with:
#
#   apt-get install -y protobuf-compiler          # protoc 3.21.12
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12   # go.mod's protobuf
#   go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2    # what etcd v3.7 uses
#
# protostub/ stands in for the etcd protos imported (see its files).
set -eu
cd "$(dirname "$0")"
PATH="$(go env GOPATH)/bin:$PATH"
for pkg in v3electionpb v3lockpb; do
	protoc -I . -I protostub \
		--go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative \
		"$pkg"/*.proto
done
