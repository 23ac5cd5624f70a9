package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/bdnvol/bdnvol/internal/byterange"
	"github.com/bdnvol/bdnvol/internal/ratelimit"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// s3Store is the objects under a prefix of an S3 bucket, or of any
// S3-compatible store (MinIO, R2, Ceph) at a custom endpoint.
type s3Store struct {
	client *s3.Client
	bucket string
	prefix string // "" or ending in "/"
	single string // the key, when the URI names one object
	uri    string
	endpt  string // the custom endpoint, "" for AWS's
}

// newS3 parses BUCKET[/PREFIX] and loads the AWS SDK's default
// configuration (environment, shared files, SSO, IMDS, web identity).
func newS3(ctx context.Context, rest string, opt Options) (backend, error) {
	bucket, prefix, _ := strings.Cut(rest, "/")
	if bucket == "" {
		return nil, fmt.Errorf("%w %q: want s3://BUCKET[/PREFIX]", ErrUnsupported, "s3://"+rest)
	}
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("s3://%s: AWS configuration: %w", rest, err)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	endpoint := opt.Endpoint
	if endpoint == "" && cfg.BaseEndpoint != nil {
		endpoint = *cfg.BaseEndpoint
	}
	// The S3 client (not the credential providers, which reach IMDS and
	// STS at addresses of their own) dials through the network policy.
	var configured *url.URL
	if endpoint != "" {
		if configured, err = url.Parse(endpoint); err != nil || configured.Host == "" {
			return nil, fmt.Errorf("%w: S3 endpoint %q is not a URL", ErrUnsupported, endpoint)
		}
	}
	hc := &http.Client{Transport: ratelimit.Transport(newNetPolicy(opt, configured).transport(opt), opt.Limiter)}
	anonymous := strings.EqualFold(os.Getenv("AWS_NO_SIGN_REQUEST"), "true")
	client := s3.NewFromConfig(cfg, func(o *s3.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
			o.UsePathStyle = true
		}
		o.HTTPClient = hc
		if anonymous {
			o.Credentials = aws.AnonymousCredentials{}
		}
		if opt.UserAgent != "" {
			o.AppID = strings.ReplaceAll(opt.UserAgent, "/", "-")
		}
	})
	return &s3Store{client: client, bucket: bucket, prefix: prefix, uri: "s3://" + rest, endpt: endpoint}, nil
}

func (s *s3Store) String() string   { return s.uri }
func (s *s3Store) revision() string { return "" }

// scope is the store, bucket and prefix: identifiers are compared only for
// the same key of the same bucket at the same endpoint.
func (s *s3Store) scope() string {
	return identifier(idField{"store", "s3"}, idField{"endpoint", s.endpt}, idField{"bucket", s.bucket}, idField{"prefix", s.prefix})
}

// list lists the objects under the prefix (as a directory: a trailing "/"
// is implied); when there are none and the prefix names an object, the
// source is that one object.
func (s *s3Store) list(ctx context.Context) ([]*object, error) {
	dir := s.prefix
	if dir != "" && !strings.HasSuffix(dir, "/") {
		dir += "/"
	}
	var out []*object
	// Pages are followed by hand, not with the SDK's paginator, which
	// follows a token it saw before for ever (or, told to stop, ends the
	// listing early without an error).
	var token *string
	pg := pager{name: s.String()}
	for {
		if err := pg.next(aws.ToString(token)); err != nil {
			return nil, err
		}
		page, err := s.client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket), Prefix: aws.String(dir), ContinuationToken: token})
		if err != nil {
			return nil, fmt.Errorf("%s: list: %w", s, err)
		}
		for _, obj := range page.Contents {
			key := aws.ToString(obj.Key)
			rel := strings.TrimPrefix(key, dir)
			if rel == "" || strings.HasSuffix(key, "/") {
				continue // the prefix itself, or a "directory" marker
			}
			if len(out) >= layout.MaxEntries {
				return nil, fmt.Errorf("%s: the prefix holds more than %d objects", s, layout.MaxEntries)
			}
			sums := make([]string, len(obj.ChecksumAlgorithm))
			for i, a := range obj.ChecksumAlgorithm {
				sums[i] = string(a)
			}
			id := s3Identifier(aws.ToInt64(obj.Size), aws.ToString(obj.ETag), obj.LastModified, sums, string(obj.ChecksumType))
			out = append(out, &object{path: rel, size: aws.ToInt64(obj.Size), key: key, id: id})
		}
		if !aws.ToBool(page.IsTruncated) || aws.ToString(page.NextContinuationToken) == "" {
			break
		}
		token = page.NextContinuationToken
	}
	if len(out) == 0 && s.prefix != "" && !strings.HasSuffix(s.prefix, "/") {
		head, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.prefix)})
		if err == nil {
			id := s3Identifier(aws.ToInt64(head.ContentLength), aws.ToString(head.ETag), head.LastModified, nil, string(head.ChecksumType))
			out = append(out, &object{path: path.Base(s.prefix), size: aws.ToInt64(head.ContentLength), key: s.prefix, id: id})
		}
	}
	return out, nil
}

func (s *s3Store) get(ctx context.Context, o *object, off, n int64) ([]byte, error) {
	if off < 0 || n < 0 || n > 1<<30 {
		return nil, permanentError{fmt.Errorf("%s: get %s: range of %d bytes at %d is out of range", s, o.key, n, off)}
	}
	resp, err := s.client.GetObject(ctx, &s3.GetObjectInput{
		Bucket: aws.String(s.bucket),
		Key:    aws.String(o.key),
		Range:  aws.String(byterange.Header(off, n)),
	})
	if err != nil {
		err = fmt.Errorf("%s: get %s: %w", s, o.key, err)
		var re *awshttp.ResponseError
		if errors.As(err, &re) {
			st := re.HTTPStatusCode()
			if st == 404 {
				return nil, permanentError{fmt.Errorf("%w: %w", ErrNotFound, err)}
			}
			if st < 500 && st != 408 && st != 429 {
				return nil, permanentError{err}
			}
		}
		return nil, err
	}
	defer resp.Body.Close()
	if cr := aws.ToString(resp.ContentRange); cr != "" {
		if start, ok := byterange.Start(cr); !ok || start != off {
			return nil, permanentError{fmt.Errorf("%s: get %s: asked for %s, got Content-Range %q", s, o.key, byterange.Header(off, n), cr)}
		}
	} else if off > 0 {
		return nil, permanentError{fmt.Errorf("%s: get %s: the store ignored the range %s", s, o.key, byterange.Header(off, n))}
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		return nil, fmt.Errorf("%s: get %s range %s: %w", s, o.key, byterange.Header(off, n), err)
	}
	return buf, nil
}
