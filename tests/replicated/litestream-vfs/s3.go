package main

// The replica on object storage: Litestream's s3 replica client against a real S3 server on
// 127.0.0.1 (tools/s3-server.sh starts SeaweedFS), the readers behind a delaying reverse proxy
// that emulates object storage's latency on the loopback path and counts the GETs.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/litestream"
	"github.com/benbjohnson/litestream/file"
	"github.com/benbjohnson/litestream/s3"
)

// replicaSpec says where the replica is: a directory (file://) or an S3 bucket and path.
type replicaSpec struct {
	dir string // file replica

	bucket, path string
	endpoint     string // the S3 server, for the writer (`litestream replicate`)
	readEndpoint string // what the readers use: the delaying proxy in front of endpoint
}

func (r *replicaSpec) isS3() bool { return r.bucket != "" }

// dummy keys: the server checks none, and static keys keep the AWS SDK from asking the EC2
// metadata service for credentials (traffic off this machine).
const dummyKey = "bpe-local"

// parseReplica reads -replica: empty (a file replica under the work directory, or
// -replica-dir) or s3://BUCKET/PATH?endpoint=http://127.0.0.1:PORT.
func parseReplica(raw, dir string) (*replicaSpec, error) {
	if raw == "" {
		d := *replicaDir
		if d == "" {
			d = filepath.Join(dir, "replica")
		}
		return &replicaSpec{dir: d}, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("-replica %q: %w", raw, err)
	}
	if u.Scheme != "s3" || u.Host == "" {
		return nil, fmt.Errorf("-replica %q: want s3://BUCKET/PATH?endpoint=http://127.0.0.1:PORT", raw)
	}
	ep := u.Query().Get("endpoint")
	e, err := url.Parse(ep)
	if err != nil || ep == "" || e.Scheme != "http" {
		return nil, fmt.Errorf("-replica %q: the endpoint query parameter must be an http:// URL", raw)
	}
	if h := e.Hostname(); h != "127.0.0.1" && h != "localhost" {
		return nil, fmt.Errorf("-replica %q: the endpoint must be on 127.0.0.1 (this harness talks to no other host)", raw)
	}
	p := strings.Trim(u.Path, "/")
	if p == "" {
		return nil, fmt.Errorf("-replica %q: a path inside the bucket is required (s3://BUCKET/PATH)", raw)
	}
	return &replicaSpec{bucket: u.Host, path: p, endpoint: ep, readEndpoint: ep}, nil
}

// readerURL is the replica's URL as Litestream's own loadable VFS reads it from
// LITESTREAM_REPLICA_URL: the proxy's endpoint, path style, a region.
func (r *replicaSpec) readerURL() string {
	if !r.isS3() {
		return "file://" + r.dir
	}
	q := url.Values{}
	q.Set("endpoint", r.readEndpoint)
	q.Set("force-path-style", "true")
	q.Set("region", "us-east-1")
	return "s3://" + r.bucket + "/" + r.path + "?" + q.Encode()
}

// readerClient is the replica client of this process's Litestream VFS.
func (r *replicaSpec) readerClient() (litestream.ReplicaClient, error) {
	if !r.isS3() {
		return file.NewReplicaClient(r.dir), nil
	}
	c := s3.NewReplicaClient()
	c.Bucket, c.Path, c.Region = r.bucket, r.path, "us-east-1"
	c.Endpoint, c.ForcePathStyle = r.readEndpoint, true
	c.AccessKeyID, c.SecretAccessKey = dummyKey, dummyKey
	return c, nil
}

// writerYAML is the replica's entry in `litestream replicate`'s configuration: straight to the
// server (the writer's latency is not what is measured).
func (r *replicaSpec) writerYAML() string {
	if !r.isS3() {
		return fmt.Sprintf("      - url: file://%s\n", r.dir)
	}
	return fmt.Sprintf("      - url: s3://%s/%s\n        endpoint: %s\n        region: us-east-1\n"+
		"        force-path-style: true\n        access-key-id: %s\n        secret-access-key: %s\n",
		r.bucket, r.path, r.endpoint, dummyKey, dummyKey)
}

// exists says whether the replica holds any LTX file at level 0.
func replicaExists(ctx context.Context, c litestream.ReplicaClient) (bool, error) {
	itr, err := c.LTXFiles(ctx, 0, 0, false)
	if err != nil {
		if os.IsNotExist(err) {
			return false, nil
		}
		return false, err
	}
	defer itr.Close()
	return itr.Next(), itr.Err()
}

// gets counts the GETs the proxy forwarded, by what Litestream asks for:
//   - Page: a closed byte range inside an LTX file other than its header (FetchPage: one page);
//   - Index: an open range to an LTX file's end (FetchPageIndex: the page index and trailer);
//   - Header: bytes 0-99 (an LTX file's header: the page size at open);
//   - List: a bucket listing (the LTX files of a level: each open and each poll);
//   - Other: whole objects and HEADs.
//
// ByOthers counts those (of any kind) whose User-Agent is not the Go AWS SDK's: any other
// client in the process that reads the replica from LITESTREAM_REPLICA_URL.
type gets struct{ Page, Index, Header, List, Other, ByOthers int64 }

func (g gets) sub(o gets) gets {
	return gets{g.Page - o.Page, g.Index - o.Index, g.Header - o.Header, g.List - o.List,
		g.Other - o.Other, g.ByOthers - o.ByOthers}
}

func (g gets) total() int64 { return g.Page + g.Index + g.Header + g.List + g.Other }

func (g gets) String() string {
	return fmt.Sprintf("GETs page %d index %d header %d list %d other %d (not Litestream's %d)",
		g.Page, g.Index, g.Header, g.List, g.Other, g.ByOthers)
}

// proxy is a reverse proxy in front of the S3 server that sleeps `delay` before forwarding each
// GET or HEAD (object storage's first-byte latency) and counts them.
type proxy struct {
	delay                                      time.Duration
	url                                        string
	page, index, header, list, other, byOthers atomic.Int64
	ln                                         net.Listener
}

func startProxy(target string, delay time.Duration) (*proxy, error) {
	t, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{delay: delay, url: "http://" + ln.Addr().String(), ln: ln}
	rp := httputil.NewSingleHostReverseProxy(t)
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		// A client that gave up (a connection closed mid-read) is no error of the server's.
		if !errors.Is(err, context.Canceled) {
			fmt.Fprintf(os.Stderr, "proxy: %s %s: %v\n", r.Method, r.URL, err)
		}
		w.WriteHeader(http.StatusBadGateway)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			p.count(r)
			if p.delay > 0 {
				time.Sleep(p.delay)
			}
		}
		// The Host header stays the proxy's (what the client signed); the server checks no
		// signature.
		rp.ServeHTTP(w, r)
	})
	go http.Serve(ln, handler) //nolint:errcheck // ends when the listener closes
	return p, nil
}

func (p *proxy) count(r *http.Request) {
	if !strings.Contains(r.Header.Get("User-Agent"), "aws-sdk-go") {
		p.byOthers.Add(1)
	}
	q := r.URL.Query()
	key := strings.Trim(r.URL.Path, "/")
	rg := r.Header.Get("Range")
	switch {
	case r.Method == http.MethodHead:
		p.other.Add(1)
	case q.Has("list-type") || q.Has("prefix") || !strings.Contains(key, "/"):
		p.list.Add(1)
	case rg == "":
		p.other.Add(1)
	case rg == "bytes=0-99":
		p.header.Add(1)
	case strings.HasSuffix(rg, "-"):
		p.index.Add(1)
	default:
		p.page.Add(1)
	}
}

func (p *proxy) snapshot() gets {
	if p == nil {
		return gets{}
	}
	return gets{p.page.Load(), p.index.Load(), p.header.Load(), p.list.Load(), p.other.Load(), p.byOthers.Load()}
}

// setupS3Env points this process's other readers of the replica (LITESTREAM_REPLICA_URL, as
// Litestream's loadable VFS reads it) at the proxy, and gives the AWS SDK static dummy keys and
// no metadata service, before anything loads.
func setupS3Env(r *replicaSpec) {
	os.Setenv("LITESTREAM_REPLICA_URL", r.readerURL())
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} {
		if os.Getenv(k) == "" {
			os.Setenv(k, dummyKey)
		}
	}
	os.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	// The server is plain http on 127.0.0.1; a CA bundle in the environment makes the SDK fail
	// to load its configuration with Litestream's own HTTP client ("unable to add custom RootCAs
	// HTTPClient"), in this process and in `litestream replicate`, which inherits it.
	os.Unsetenv("AWS_CA_BUNDLE")
	os.Setenv("AWS_REGION", "us-east-1")
}

// delayNote is what every result line says about the latency emulated.
func delayNote() string {
	if !replicaSpecIsS3 {
		return "replica file://, no proxy"
	}
	return fmt.Sprintf("S3 through a proxy adding %v per GET", *s3Delay)
}
