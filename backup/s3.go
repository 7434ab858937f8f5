package backup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Target is a Target on a prefix of a bucket in an S3-compatible object
// store (s3://bucket/prefix), through minio-go: strata speaks no S3 of its
// own.
type S3Target struct {
	c      *minio.Client
	bucket string
	prefix string // "" or ending in '/'
	url    string
}

// openS3 opens s3://bucket/prefix with opts, the environment filling what
// opts leave empty (TargetOptions).
func openS3(ctx context.Context, u *url.URL, opts TargetOptions) (*S3Target, error) {
	bucket := u.Host
	if bucket == "" {
		return nil, fmt.Errorf("backup target %q: no bucket (s3://bucket/prefix)", u)
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		if err := checkName(prefix); err != nil {
			return nil, fmt.Errorf("backup target %q: %w", u, err)
		}
		prefix += "/"
	}
	endpoint := cmp.Or(opts.Endpoint, os.Getenv("AWS_ENDPOINT_URL_S3"), os.Getenv("AWS_ENDPOINT_URL"), "s3.amazonaws.com")
	secure := !opts.Insecure
	if strings.Contains(endpoint, "://") {
		e, err := url.Parse(endpoint)
		if err != nil {
			return nil, fmt.Errorf("backup target %q: endpoint %q: %w", u, endpoint, err)
		}
		switch e.Scheme {
		case "http":
			secure = false
		case "https":
			secure = true
		default:
			return nil, fmt.Errorf("backup target %q: endpoint %q: want http or https", u, endpoint)
		}
		if e.Path != "" && e.Path != "/" {
			return nil, fmt.Errorf("backup target %q: endpoint %q has a path; the bucket goes in the target URL", u, endpoint)
		}
		endpoint = e.Host
	}
	var creds *credentials.Credentials
	switch {
	case opts.AccessKey != "" || opts.SecretKey != "":
		if opts.AccessKey == "" || opts.SecretKey == "" {
			return nil, fmt.Errorf("backup target %q: give both the access key and the secret key", u)
		}
		creds = credentials.NewStaticV4(opts.AccessKey, opts.SecretKey, "")
	default:
		// No instance-metadata provider: it would probe a link-local
		// address on every machine that is not a cloud VM.
		creds = credentials.NewChainCredentials([]credentials.Provider{
			&credentials.EnvAWS{},
			&credentials.FileAWSCredentials{},
		})
	}
	region := cmp.Or(opts.Region, os.Getenv("AWS_REGION"), os.Getenv("AWS_DEFAULT_REGION"))
	c, err := minio.New(endpoint, &minio.Options{Creds: creds, Secure: secure, Region: region})
	if err != nil {
		return nil, fmt.Errorf("backup target %q: %w", u, err)
	}
	t := &S3Target{c: c, bucket: bucket, prefix: prefix, url: "s3://" + bucket + "/" + prefix}
	ok, err := c.BucketExists(ctx, bucket)
	if err != nil {
		if refusedCredentials(err) {
			key, from := credentialsSource(opts, creds)
			return nil, fmt.Errorf("backup target %s at %s: %w (access key %q from %s): %w", t.url, c.EndpointURL(), ErrCredentials, key, from, err)
		}
		return nil, fmt.Errorf("backup target %s at %s: %w", t.url, c.EndpointURL(), err)
	}
	if !ok {
		return nil, fmt.Errorf("backup target %s at %s: bucket %q does not exist", t.url, c.EndpointURL(), bucket)
	}
	return t, nil
}

// ErrCredentials: the S3 server refused the credentials (an unknown
// access key, a wrong secret key, or a key without access to the bucket).
var ErrCredentials = errors.New("the S3 server refused the credentials")

// refusedCredentials reports whether err is S3's answer to credentials it
// does not accept.
func refusedCredentials(err error) bool {
	switch minio.ToErrorResponse(err).Code {
	case "SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied", "InvalidToken", "ExpiredToken":
		return true
	}
	return false
}

// credentialsSource names the access key used and where it came from, for
// an error message (never the secret).
func credentialsSource(opts TargetOptions, creds *credentials.Credentials) (key, from string) {
	switch {
	case opts.AccessKey != "":
		return opts.AccessKey, "--s3-access-key/--s3-secret-key"
	case os.Getenv("AWS_ACCESS_KEY_ID") != "":
		return os.Getenv("AWS_ACCESS_KEY_ID"), "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
	}
	v, err := creds.GetWithContext(nil) // env and file providers only: no HTTP client needed
	if err != nil || v.AccessKeyID == "" {
		return "", "no credentials found (AWS_ACCESS_KEY_ID or ~/.aws/credentials)"
	}
	return v.AccessKeyID, "the shared credentials file (~/.aws/credentials)"
}

// String implements Target.
func (t *S3Target) String() string { return t.url }

func (t *S3Target) key(name string) string { return t.prefix + name }

// notFound reports whether err is S3's answer for an absent key.
func notFound(err error) bool {
	r := minio.ToErrorResponse(err)
	return r.Code == "NoSuchKey" || r.StatusCode == http.StatusNotFound && r.Code != "NoSuchBucket"
}

// Put implements Target. The PUT carries If-None-Match: * (S3's
// conditional write, honoured by MinIO and AWS), so a name is never
// overwritten, and a Content-MD5, so a torn upload is refused by the
// server rather than stored. An object above minio-go's single-PUT size
// (16 MiB) goes up in parts; whether the server applies If-None-Match to
// the completion of a multipart upload varies, which is harmless for
// files (same name, same bytes) and manifests are small.
func (t *S3Target) Put(ctx context.Context, name string, r io.Reader, size int64) error {
	if err := checkName(name); err != nil {
		return err
	}
	// DisableContentSha256: over http minio-go would otherwise sign the
	// body as a stream of signed chunks (over https it never does). Some
	// S3 servers store such parts still chunk-encoded (gofakes3, in the
	// e2e tests), and an empty body would go out without a
	// Content-Length, which S3 refuses. The Content-MD5 of every PUT (or
	// part) still lets the server refuse a damaged upload.
	opts := minio.PutObjectOptions{SendContentMd5: true, DisableContentSha256: true, ContentType: "application/octet-stream"}
	opts.SetMatchETagExcept("*")
	if _, err := t.c.PutObject(ctx, t.bucket, t.key(name), r, size, opts); err != nil {
		if resp := minio.ToErrorResponse(err); resp.Code == "PreconditionFailed" || resp.StatusCode == http.StatusPreconditionFailed {
			return fmt.Errorf("put %s: %w", name, ErrExist)
		}
		return fmt.Errorf("put %s to %s: %w", name, t, err)
	}
	return nil
}

// Get implements Target.
func (t *S3Target) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	obj, err := t.c.GetObject(ctx, t.bucket, t.key(name), minio.GetObjectOptions{})
	if err == nil {
		// GetObject is lazy: Stat makes the request, so that an absent
		// key is an error here rather than on the first Read.
		_, err = obj.Stat()
	}
	if err != nil {
		if obj != nil {
			_ = obj.Close()
		}
		if notFound(err) {
			return nil, fmt.Errorf("get %s: %w", name, ErrNotExist)
		}
		return nil, fmt.Errorf("get %s from %s: %w", name, t, err)
	}
	return obj, nil
}

// Stat implements Target.
func (t *S3Target) Stat(ctx context.Context, name string) (Object, error) {
	if err := checkName(name); err != nil {
		return Object{}, err
	}
	info, err := t.c.StatObject(ctx, t.bucket, t.key(name), minio.StatObjectOptions{})
	if err != nil {
		if notFound(err) {
			return Object{}, fmt.Errorf("stat %s: %w", name, ErrNotExist)
		}
		return Object{}, fmt.Errorf("stat %s in %s: %w", name, t, err)
	}
	return Object{Name: name, Size: info.Size}, nil
}

// List implements Target.
func (t *S3Target) List(ctx context.Context, prefix string) ([]Object, error) {
	var out []Object
	for info := range t.c.ListObjects(ctx, t.bucket, minio.ListObjectsOptions{Prefix: t.key(prefix), Recursive: true}) {
		if info.Err != nil {
			return nil, fmt.Errorf("list %s in %s: %w", prefix, t, info.Err)
		}
		name, ok := strings.CutPrefix(info.Key, t.prefix)
		if !ok {
			return nil, fmt.Errorf("list %s in %s: key %q outside the prefix", prefix, t, info.Key)
		}
		out = append(out, Object{Name: name, Size: info.Size})
	}
	slices.SortFunc(out, func(a, b Object) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Delete implements Target.
func (t *S3Target) Delete(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := t.c.RemoveObject(ctx, t.bucket, t.key(name), minio.RemoveObjectOptions{}); err != nil && !notFound(err) {
		return fmt.Errorf("delete %s from %s: %w", name, t, err)
	}
	return nil
}
