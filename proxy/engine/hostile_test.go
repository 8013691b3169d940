package engine

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"
)

// A backend's metrics endpoint is scraped on bounded terms: whatever it
// declares or sends, a scrape fails (or succeeds) without allocating by a
// length it sent, without following it elsewhere and within the timeout.
func TestScraperHostileEngines(t *testing.T) {
	huge := func(w http.ResponseWriter, _ *http.Request) {
		// A declared length of 4 EiB, and then a few bytes.
		w.Header().Set("Content-Length", "4611686018427387904")
		w.WriteHeader(200)
		w.Write([]byte("vllm:num_requests_running 1\n"))
	}
	for _, tc := range []struct {
		name string
		h    http.HandlerFunc
	}{
		{"absurd Content-Length", huge},
		{"redirect elsewhere", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/", http.StatusFound)
		}},
		{"header over 64 KiB", func(w http.ResponseWriter, _ *http.Request) {
			for i := 0; i < 40; i++ {
				w.Header().Add("X-Pad", strings.Repeat("p", 4<<10))
			}
			w.Write([]byte("vllm:num_requests_running 1\n"))
		}},
		{"body over the limit", func(w http.ResponseWriter, _ *http.Request) {
			line := []byte("vllm:num_requests_running{x=\"" + strings.Repeat("y", 1000) + "\"} 1\n")
			for i := 0; i < (9<<20)/len(line); i++ {
				if _, err := w.Write(line); err != nil {
					return
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.h)
			defer srv.Close()
			var pub published
			cfg := DefaultConfig()
			cfg.Timeout = 2 * time.Second
			cfg.MaxBodyBytes = 1 << 20
			s := newTestScraper(t, cfg, []Target{{"b", srv.URL + "/metrics"}}, func(string) bool { return true }, &pub)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			start := time.Now()
			s.round(context.Background(), nil)
			runtime.ReadMemStats(&after)
			st, n := pub.last("b")
			if n != 1 || st.OK {
				t.Fatalf("published %+v (%d), want one failed scrape", st, n)
			}
			if took := time.Since(start); took > cfg.Timeout+time.Second {
				t.Fatalf("the scrape took %v, over its timeout", took)
			}
			// A few times the body limit at most (the buffer doubles as
			// it grows), whatever the length declared or sent.
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
				t.Fatalf("one scrape allocated %d MiB", grew>>20)
			}
		})
	}
}

// The redirect is not followed: nothing reaches the address it names.
func TestScraperDoesNotFollowRedirects(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		t.Error("the redirect was followed")
	})}
	go target.Serve(ln)
	defer target.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://"+ln.Addr().String()+"/metrics", http.StatusFound)
	}))
	defer srv.Close()
	var pub published
	s := newTestScraper(t, DefaultConfig(), []Target{{"b", srv.URL + "/metrics"}}, func(string) bool { return true }, &pub)
	s.round(context.Background(), nil)
	if st, n := pub.last("b"); n != 1 || st.OK {
		t.Fatalf("published %+v (%d), want a failed scrape", st, n)
	}
}

// A value longer than any float64 is skipped, like any other malformed
// sample, and the line's other figures are still read.
func TestParseLongValueSkipped(t *testing.T) {
	p, err := NewParser(DefaultMapping())
	if err != nil {
		t.Fatal(err)
	}
	body := "vllm:num_requests_running 1" + strings.Repeat("0", 100) + "\nvllm:num_requests_waiting 3\n"
	sm := p.Parse([]byte(body))
	if sm.Known&KnownRunning != 0 || sm.Known&KnownWaiting == 0 || sm.Waiting != 3 {
		t.Fatalf("parsed %+v", sm)
	}
}
