// Command s3server is an S3-compatible object store for strata's
// end-to-end tests of s3:// backup targets: gofakes3 (MIT licensed)
// serving the S3 protocol over HTTP, with its objects in a bbolt file that
// is synced on every write, so that the store survives kill -9 as a real
// server's disk would.
//
//	s3server --listen 127.0.0.1:PORT --db DIR/s3.db --bucket NAME
//
// It creates the bucket if it is missing and prints "s3server ready on
// ADDR" once it accepts connections. It checks no signature: any
// credentials are accepted, so wrong credentials cannot be tested with it.
//
// MinIO, which the backup issue names, is not used: its server is under
// the AGPL, which the project's dependency rules exclude.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3bolt"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "Address to serve S3 on.")
	db := flag.String("db", "", "The bbolt file holding the objects (created if missing).")
	bucket := flag.String("bucket", "", "A bucket to create if it is missing.")
	flag.Parse()
	if err := run(*listen, *db, *bucket); err != nil {
		fmt.Fprintln(os.Stderr, "s3server:", err)
		os.Exit(1)
	}
}

func run(listen, db, bucket string) error {
	if db == "" {
		return errors.New("--db is required")
	}
	backend, err := s3bolt.NewFile(db)
	if err != nil {
		return fmt.Errorf("open %s: %w", db, err)
	}
	if bucket != "" {
		ok, err := backend.BucketExists(bucket)
		if err != nil {
			return fmt.Errorf("bucket %s: %w", bucket, err)
		}
		if !ok {
			if err := backend.CreateBucket(bucket); err != nil {
				return fmt.Errorf("create bucket %s: %w", bucket, err)
			}
		}
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	fmt.Printf("s3server ready on %s\n", ln.Addr())
	return http.Serve(ln, gofakes3.New(backend).Server())
}
