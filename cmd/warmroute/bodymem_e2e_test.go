package main

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// TestE2EBodyMemoryBounded: clients without credentials that send large
// bodies and hold back their last byte cannot take the router's memory.
// Fifty connections each send 31 MiB of a 31 MiB body but its last byte
// (on 114309c the router's RSS went from about 22 MB to 1.5 GB; fifty such
// connections had it OOM-killed in a 1.5 GiB limit). Now the bodies are
// held against max-body-memory (128 MiB by default, bodies over 1 MiB
// sharing half of it): the router's RSS stays under 256 MiB, the bodies
// that find no room are answered 503 body_memory_full, clients with
// ordinary prompts are served meanwhile, and once the senders close the
// memory comes back within 30 s.
func TestE2EBodyMemoryBounded(t *testing.T) {
	t.Parallel()
	needBinary(t)
	urls := startGpusimFleet(t, 2)
	r := startRouter(t, proc.ServeArgs{Backends: urls, NoEngineMetrics: true})
	addr := strings.TrimPrefix(r.url, "http://")
	idle, err := r.RSS()
	if err != nil {
		t.Fatal(err)
	}

	const (
		senders = 50
		size    = 31 << 20
	)
	// Sample the router's RSS every 50 ms until the end of the test.
	var peak atomic.Int64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			if v, err := r.RSS(); err == nil && v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	defer func() { close(stop); sampler.Wait() }()

	// Each sender writes the head and all of the body but its last byte,
	// then holds the connection until the test lets go (or the router
	// answers and closes it).
	head := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size)
	chunk := make([]byte, 256<<10)
	for i := range chunk {
		chunk[i] = 'a'
	}
	release := make(chan struct{})
	var sent, refused atomic.Int64
	var senderWG sync.WaitGroup
	for i := 0; i < senders; i++ {
		senderWG.Add(1)
		go func() {
			defer senderWG.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			// Reads the router's answer, if it gives one before release.
			answered := make(chan string, 1)
			go func() {
				var b [512]byte
				c.SetReadDeadline(time.Now().Add(60 * time.Second))
				n, _ := c.Read(b[:])
				answered <- string(b[:n])
			}()
			c.SetWriteDeadline(time.Now().Add(20 * time.Second))
			if _, err := c.Write([]byte(head)); err != nil {
				return
			}
			for left := size - 1; left > 0; {
				n := min(left, len(chunk))
				if _, err := c.Write(chunk[:n]); err != nil {
					break
				}
				left -= n
				if left == 0 {
					sent.Add(1)
				}
			}
			select {
			case a := <-answered:
				if strings.Contains(a, " 503 ") && strings.Contains(a, "body_memory_full") {
					refused.Add(1)
				} else if a != "" {
					t.Errorf("a held upload got %q", firstLine(a))
				}
			case <-release:
			}
		}()
	}

	// While the uploads are held, clients with ordinary prompts are served.
	deadline := time.Now().Add(25 * time.Second)
	served := 0
	for served < 20 && time.Now().Before(deadline) {
		resp, body := postChat(t, r.url, string(chatJSON(gpusimModel, fmt.Sprintf("question %d about a short document", served))))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("an ordinary request during the uploads got %d: %s", resp.StatusCode, body)
		}
		served++
		time.Sleep(100 * time.Millisecond)
	}
	// Give the senders time to push what they can.
	if _, err := pollUntil(60*time.Second, func() (bool, error) {
		return sent.Load()+refused.Load() >= senders, r.Alive()
	}); err != nil {
		t.Errorf("uploads sent %d, refused %d of %d: %v", sent.Load(), refused.Load(), senders, err)
	}
	held := peak.Load()
	t.Logf("idle RSS %d MiB; peak during %d held uploads of 31 MiB %d MiB; %d uploads refused with body_memory_full; %d ordinary requests served",
		idle>>20, senders, held>>20, refused.Load(), served)
	if held >= 256<<20 {
		t.Errorf("the router's RSS reached %d MiB under %d held 31 MiB uploads, want under 256 MiB", held>>20, senders)
	}
	if refused.Load() == 0 {
		t.Errorf("no upload was refused with 503 body_memory_full")
	}
	close(release)
	senderWG.Wait()

	// The memory comes back once the uploads are gone.
	start := time.Now()
	var last int64
	_, err = pollUntil(30*time.Second, func() (bool, error) {
		time.Sleep(100 * time.Millisecond)
		var err error
		last, err = r.RSS()
		return last <= idle+32<<20, err
	})
	t.Logf("RSS %d MiB %.1f s after the uploads closed", last>>20, time.Since(start).Seconds())
	if err != nil {
		t.Errorf("the router's RSS stayed at %d MiB 30 s after the uploads closed (idle %d MiB)", last>>20, idle>>20)
	}
	alive(t, r)
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\r\n")
	return l
}
