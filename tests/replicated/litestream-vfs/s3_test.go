package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The proxy forwards every request to the server and counts each GET by what Litestream's s3
// client asks for, as OpenLTXFile and ListObjectsV2 form them.
func TestProxyForwardsAndCountsGETsByKind(t *testing.T) {
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("Range"))
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	p, err := startProxy(srv.URL, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.ln.Close()
	do := func(method, path, rg, ua string) {
		req, _ := http.NewRequest(method, p.url+path, strings.NewReader(""))
		if rg != "" {
			req.Header.Set("Range", rg)
		}
		req.Header.Set("User-Agent", ua)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "ok" && method != http.MethodHead {
			t.Fatalf("%s %s: the proxy answered %q, not the server's body", method, path, b)
		}
	}
	sdk := "aws-sdk-go-v2/1.41.5 os/linux"
	key := "/bpe/db/0000/0000000000000001-0000000000000001.ltx"
	do(http.MethodGet, key, "bytes=4196-8301", sdk)                     // a page
	do(http.MethodGet, key, "bytes=4300-8400", sdk)                     // another page
	do(http.MethodGet, key, "bytes=61000000-", sdk)                     // the page index
	do(http.MethodGet, key, "bytes=0-99", sdk)                          // the header
	do(http.MethodGet, "/bpe?list-type=2&prefix=db%2F0000%2F", "", sdk) // a listing
	do(http.MethodGet, key, "", "")                                     // a whole object, not the SDK
	do(http.MethodHead, key, "", sdk)
	do(http.MethodPut, key, "", sdk) // forwarded, not counted
	want := gets{Page: 2, Index: 1, Header: 1, List: 1, Other: 2, ByOthers: 1}
	if got := p.snapshot(); got != want {
		t.Fatalf("counted %+v, want %+v", got, want)
	}
	if len(seen) != 8 {
		t.Fatalf("the server saw %d requests, want 8: %v", len(seen), seen)
	}
	if seen[0] != "GET "+key+" bytes=4196-8301" {
		t.Fatalf("the server saw %q first: the path or the range was not kept", seen[0])
	}
}

func TestParseReplicaRefusesWhatItCannotServe(t *testing.T) {
	for raw, wantErr := range map[string]string{
		"s3://b/db?endpoint=http://127.0.0.1:8333":   "",
		"s3://b?endpoint=http://127.0.0.1:8333":      "a path inside the bucket",
		"s3://b/db":                                  "endpoint query parameter",
		"s3://b/db?endpoint=http://s3.amazonaws.com": "must be on 127.0.0.1",
		"gs://b/db?endpoint=http://127.0.0.1:1":      "want s3://",
		"s3://b/db?endpoint=https://127.0.0.1:8333":  "http:// URL",
	} {
		r, err := parseReplica(raw, t.TempDir())
		switch {
		case wantErr == "" && err != nil:
			t.Errorf("%s: %v", raw, err)
		case wantErr == "" && (r.bucket != "b" || r.path != "db" || r.endpoint != "http://127.0.0.1:8333"):
			t.Errorf("%s: parsed %+v", raw, r)
		case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
			t.Errorf("%s: error %v, want one saying %q", raw, err, wantErr)
		}
	}
}
