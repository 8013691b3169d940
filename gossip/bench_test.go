package gossip

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// benchSource reports its backends' figures, of which `changes` change
// every 50 ms of wall time, spread evenly over it whatever the rate at
// which the Mesh reads the source. Without open requests (BenchmarkPropagation,
// 100 backends) a change moves one figure: 0 (idle), 10 (a busy router:
// at 200 requests/s each start and end moves a figure, ~20 moves per 50
// ms spread over 100 backends) or all 100 (worst case), and figures
// never return to 0. With open requests (BenchmarkFleetGossip) the
// source holds that many requests on random backends and a change ends
// one and starts another on a random backend (two figure moves, one
// request), so figures go back to 0 as they do on a router. The probe
// backend carries the value whose propagation is timed.
type benchSource struct {
	changes  atomic.Int64
	backends []string
	vals     []int64
	open     []int // backend index of each open request (fleet mode)
	period   time.Duration
	probe    string
	probeV   atomic.Int64
	step     int64
	last     time.Time
	carry    float64
}

func newBenchSource(backends []string, open int, probe string) *benchSource {
	s := &benchSource{backends: backends, vals: make([]int64, len(backends)), open: make([]int, open), probe: probe, period: benchChangePeriod}
	for i := range s.open {
		s.open[i] = rand.N(len(backends))
		s.vals[s.open[i]]++
	}
	return s
}

// benchChangePeriod is the period of benchSource's `changes` changes.
const benchChangePeriod = 50 * time.Millisecond

func (s *benchSource) AppendInFlight(dst []BackendLoad) []BackendLoad {
	now := time.Now()
	if k := s.changes.Load(); k > 0 && !s.last.IsZero() {
		s.carry += float64(k) * float64(now.Sub(s.last)) / float64(s.period)
		n := int64(s.carry)
		s.carry -= float64(n)
		for range n {
			s.step++
			if len(s.open) > 0 {
				r := rand.N(len(s.open))
				s.vals[s.open[r]]--
				s.open[r] = rand.N(len(s.vals))
				s.vals[s.open[r]]++
				continue
			}
			i := s.step % int64(len(s.vals))
			s.vals[i] = 1 + (s.vals[i]+s.step)%17
		}
	}
	s.last = now
	for i, b := range s.backends {
		dst = append(dst, BackendLoad{Backend: b, InFlight: s.vals[i]})
	}
	return append(dst, BackendLoad{Backend: s.probe, InFlight: s.probeV.Load()})
}

// BenchmarkPropagation measures, in one process over loopback UDP, how
// long a changed in-flight figure takes to appear in every other node's
// View, and how many bytes each node sends per second, for 5, 20 and 50
// router nodes with 100 backends each. One op = one figure change on one
// node, seen by all others: the probe goes from 0 to 1 (a request
// starts; p50-ms, p99-ms) and at the next op back to 0 (it ends;
// down-p50-ms, down-p99-ms), each at a random phase of the sender's
// publish tick.
func BenchmarkPropagation(b *testing.B) {
	for _, n := range []int{5, 20, 50} {
		for _, mode := range benchModes {
			b.Run(fmt.Sprintf("nodes=%d/backends=100/%s", n, mode.name), func(b *testing.B) {
				benchPropagation(b, n, 100, 0, mode.changes, nil)
			})
		}
	}
}

// BenchmarkFleetGossip is BenchmarkPropagation for a large fleet: 20
// and 50 routers, each with the same 1,000 backends. Modes: idle (no
// request open), busy (a router at 200 requests/s with 400 open, about 2
// s each: ~330 backends with a non-zero figure, 20 figure moves per 50
// ms) and worst (2,000 requests/s with 4,000 open: nearly every figure
// non-zero, 200 moves per 50 ms).
//
// 50 loaded routers in one process send each other about 100,000 packets
// per second, more than two cores carry: the kernel drops datagrams
// (udp-drop-%), memberlist declares live routers dead, and the figures
// measure the starved machine. So those runs are slowed down (dilate=10):
// every interval and timeout of the Config is 10 times longer and the
// load 10 times slower, which divides every rate in the process by 10
// and leaves the protocol's decisions as they are. The reported figures
// are converted back: rates times 10, latencies divided by 10 (the part
// of a latency that does not scale, a packet's transit and processing,
// is well under a millisecond when the machine keeps up).
func BenchmarkFleetGossip(b *testing.B) {
	for _, c := range []struct {
		n, dilate int
	}{{20, 1}, {50, 1}, {50, 10}} {
		for _, mode := range []struct {
			name    string
			open    int
			changes int64
		}{{"idle", 0, 0}, {"busy", 400, 10}, {"worst", 4000, 100}} {
			if c.dilate == 1 && c.n == 50 && mode.open > 0 {
				continue
			}
			b.Run(fmt.Sprintf("nodes=%d/backends=1000/%s/dilate=%d", c.n, mode.name, c.dilate), func(b *testing.B) {
				benchDilated(b, c.n, 1000, mode.open, mode.changes, c.dilate)
			})
		}
	}
}

// BenchmarkDecreaseLag is BenchmarkPropagation for three routers, the
// cluster of the overcount report: how long after a request ends on one
// router (its figure drops from 1 to 0) the other two stop counting it
// (down-p50-ms, down-p99-ms).
func BenchmarkDecreaseLag(b *testing.B) {
	for _, mode := range benchModes[:2] {
		b.Run(fmt.Sprintf("nodes=3/backends=100/%s", mode.name), func(b *testing.B) {
			benchPropagation(b, 3, 100, 0, mode.changes, nil)
		})
	}
}

var benchModes = []struct {
	name    string
	changes int64
}{{"idle", 0}, {"busy", 10}, {"worst", 100}}

// BenchmarkPropagationSigned is BenchmarkPropagation with an Identity on
// every node (P-256 certificates from one CA, the gossip key set): every
// load packet is signed once and verified by each receiver. 50 nodes in
// one process would verify ~49,000 signatures per second on the test
// machine's two cores, so it stops at 20; docs/gossip.md derives 50 from
// BenchmarkVerify.
func BenchmarkPropagationSigned(b *testing.B) {
	ca := newTestCA(b)
	for _, n := range []int{5, 20} {
		for _, mode := range benchModes {
			b.Run(fmt.Sprintf("nodes=%d/backends=100/%s", n, mode.name), func(b *testing.B) {
				benchPropagation(b, n, 100, 0, mode.changes, func(c *Config) {
					c.SecretKey = testKey
					c.Identity = ca.bundle(b, c.NodeName)
				})
			})
		}
	}
}

// benchPropagation runs n nodes with the same backends, each with open
// requests (benchSource) of which changes change every 50 ms, and times
// the probes (see BenchmarkPropagation).
func benchPropagation(b *testing.B, n, numBackends, open int, changes int64, mod func(*Config)) {
	benchDilated(b, n, numBackends, open, changes, 1, mod)
}

// benchDilated is benchPropagation with time slowed down dilate times
// (see BenchmarkFleetGossip); the metrics are converted back to real
// time.
func benchDilated(b *testing.B, n, numBackends, open int, changes int64, dilate int, mods ...func(*Config)) {
	backends := make([]string, numBackends)
	for i := range backends {
		backends[i] = fmt.Sprintf("gpu-%02d/", i)
	}
	srcs := make([]*benchSource, n)
	nodes := make([]*Mesh, n)
	for i := range n {
		cfg := testConfig(fmt.Sprintf("router-%02d", i))
		if i > 0 {
			cfg.Join = []string{nodes[0].Addr()}
		}
		for _, mod := range mods {
			if mod != nil {
				mod(&cfg)
			}
		}
		dilateConfig(&cfg, dilate)
		srcs[i] = newBenchSource(backends, open, "probe/"+cfg.NodeName)
		srcs[i].period *= time.Duration(dilate)
		c, err := New(cfg, srcs[i])
		if err != nil {
			b.Fatal(err)
		}
		nodes[i] = c
	}
	defer func() {
		var wg sync.WaitGroup
		for _, c := range nodes {
			wg.Go(func() { _ = c.Close() })
		}
		wg.Wait()
	}()
	waitFor(b, 60*time.Second, func() bool {
		for _, c := range nodes {
			if len(c.View().members) != n {
				return false
			}
		}
		return true
	}, "every node sees all %d members", n)

	// Each node watches its View for the current probe.
	type target struct {
		backend string
		v       int64
		start   time.Time
		from    int
	}
	var (
		cur     atomic.Pointer[target]
		mu      sync.Mutex
		lat     []time.Duration // increases
		down    []time.Duration // decreases
		pending int
		done    = make(chan struct{}, 1)
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	for i, c := range nodes {
		ch, cancel := c.Subscribe()
		wg.Go(func() {
			defer cancel()
			var seen *target
			for {
				select {
				case <-stop:
					return
				case <-ch:
				}
				tg := cur.Load()
				if tg == nil || tg == seen || tg.from == i || c.View().RemoteInFlight(tg.backend) != tg.v {
					continue
				}
				seen = tg
				d := time.Since(tg.start)
				mu.Lock()
				if tg.v == 0 {
					down = append(down, d)
				} else {
					lat = append(lat, d)
				}
				pending--
				if pending == 0 {
					done <- struct{}{}
				}
				mu.Unlock()
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()

	// Load starts once the cluster has formed; settle, then measure
	// traffic and CPU over the timed part.
	for _, src := range srcs {
		src.changes.Store(changes)
	}
	time.Sleep(2 * time.Second * time.Duration(dilate))
	cpu0 := cpuTime()
	udp0, udpOK := udpCounters()
	before := make([]Stats, n)
	for i, c := range nodes {
		before[i] = c.Stats()
	}
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		// Each sender's probe goes up at one op and down at the next.
		from := (i / 2) % n
		// Start at a random phase of the sender's publish tick.
		b.StopTimer()
		time.Sleep(rand.N(nodes[from].cfg.PublishInterval))
		b.StartTimer()
		mu.Lock()
		pending = n - 1
		mu.Unlock()
		v := 1 - srcs[from].probeV.Load()
		cur.Store(&target{backend: srcs[from].probe, v: v, start: time.Now(), from: from})
		srcs[from].probeV.Store(v)
		select {
		case <-done:
		case <-time.After(10 * time.Second * time.Duration(dilate)):
			for j, c := range nodes {
				if j == from || c.View().RemoteInFlight(srcs[from].probe) == v {
					continue
				}
				v := c.View()
				b.Logf("%s: sees %d for the probe, %d members, has sender %v, stats %+v",
					c.Name(), v.RemoteInFlight(srcs[from].probe), len(v.members), slices.Contains(v.members, nodes[from].Name()), c.Stats())
			}
			b.Fatalf("probe %d from %s (value %d) not seen everywhere; sender stats %+v", i, nodes[from].Name(), v, nodes[from].Stats())
		}
	}
	b.StopTimer()
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	minMembers := n
	for _, c := range nodes {
		minMembers = min(minMembers, len(c.View().members))
	}
	var wire, payload, recv uint64
	for i, c := range nodes {
		s := c.Stats()
		wire += s.WirePacketBytes + s.WireStreamBytes - before[i].WirePacketBytes - before[i].WireStreamBytes
		payload += s.BytesSent - before[i].BytesSent
		recv += s.MessagesReceived - before[i].MessagesReceived
	}
	perNode := func(x uint64) float64 { return float64(x) * float64(dilate) / elapsed.Seconds() / float64(n) }
	mu.Lock()
	defer mu.Unlock()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(dilate) }
	b.ReportMetric(ms(percentile(lat, 0.5)), "p50-ms")
	b.ReportMetric(ms(percentile(lat, 0.99)), "p99-ms")
	if len(down) > 0 {
		b.ReportMetric(ms(percentile(down, 0.5)), "down-p50-ms")
		b.ReportMetric(ms(percentile(down, 0.99)), "down-p99-ms")
	}
	b.ReportMetric(perNode(wire), "wire-B/s/node")
	b.ReportMetric(perNode(payload), "load-B/s/node")
	b.ReportMetric(perNode(recv), "msgs-recv/s/node")
	b.ReportMetric(cpu.Seconds()*1000*float64(dilate)/elapsed.Seconds()/float64(n), "cpu-ms/s/node")
	b.ReportMetric(float64(minMembers), "min-members")
	// Datagrams the kernel dropped because a socket's receive buffer was
	// full (the whole machine's, this benchmark being what runs): the
	// share of received packets lost when the process falls behind.
	if udp1, ok := udpCounters(); ok && udpOK && udp1[0] > udp0[0] {
		in, drops := udp1[0]-udp0[0], udp1[1]-udp0[1]
		b.ReportMetric(100*float64(drops)/float64(in+drops), "udp-drop-%")
	}
}

// dilateConfig makes every interval and timeout of cfg k times longer and
// its change budget k times smaller: time runs k times slower.
func dilateConfig(cfg *Config, k int) {
	for _, d := range []*time.Duration{&cfg.PublishInterval, &cfg.ChangeDelay, &cfg.RefreshInterval,
		&cfg.ExpireAfter, &cfg.EngineExpireAfter, &cfg.PushPullInterval, &cfg.GossipInterval,
		&cfg.ProbeInterval, &cfg.ProbeTimeout, &cfg.RejoinInterval, &cfg.LeaveTimeout} {
		*d *= time.Duration(k)
	}
	cfg.ChangeBudget = max(1, cfg.ChangeBudget/k)
}

// udpCounters returns the machine's UDP InDatagrams and RcvbufErrors
// (Linux /proc/net/snmp), or false where they cannot be read.
func udpCounters() ([2]uint64, bool) {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return [2]uint64{}, false
	}
	var names, vals []string
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "Udp:" {
			if names == nil {
				names = f
			} else {
				vals = f
			}
		}
	}
	var out [2]uint64
	found := 0
	for i, n := range names {
		if i >= len(vals) {
			break
		}
		for j, want := range []string{"InDatagrams", "RcvbufErrors"} {
			if n == want {
				v, err := strconv.ParseUint(vals[i], 10, 64)
				if err != nil {
					return out, false
				}
				out[j] = v
				found++
			}
		}
	}
	return out, found == 2
}

// cpuTime is the process's user plus system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchPacket is one publish of 100 figures from node-a.
func benchPacket(seq uint64) []byte {
	loads := make(map[string]int64, 100)
	for i := range 100 {
		loads[fmt.Sprintf("gpu-%02d/", i)] = int64(i % 17)
	}
	return publishMsg("node-a", 1, seq, loads)
}

// BenchmarkSign: signing one publish packet of 100 figures (P-256,
// internal/identity), as a node does once per packet it sends.
func BenchmarkSign(b *testing.B) {
	s, _ := newTestCA(b).signer(b, "node-a")
	msg := benchPacket(1)
	var dst, scratch []byte
	var err error
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		if dst, err = s.sign(dst[:0], msg, now, &scratch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(dst)), "bytes/packet")
}

// BenchmarkVerify: checking the signature of one such packet, as every
// receiver does for each packet it applies (the chain is verified once
// and cached; see BenchmarkVerifyChain).
func BenchmarkVerify(b *testing.B) {
	s, id := newTestCA(b).signer(b, "node-a")
	var scratch []byte
	msg, err := s.sign(nil, benchPacket(1), time.Now(), &scratch)
	if err != nil {
		b.Fatal(err)
	}
	var m wireMsg
	if err := m.decode(msg); err != nil {
		b.Fatal(err)
	}
	_, verify, _, _ := id.Verifier(id.Chain())
	key := &peerKey{verify: verify}
	b.ReportAllocs()
	for b.Loop() {
		if !key.verifySig(m.signed, m.sig, &scratch) {
			b.Fatal("bad signature")
		}
	}
}

// BenchmarkVerifyChain: verifying a router's certificate chain against the
// cluster CA, once per chain (then cached until it expires).
func BenchmarkVerifyChain(b *testing.B) {
	ca := newTestCA(b)
	self, peer := ca.bundle(b, "self"), ca.bundle(b, "node-a")
	b.ReportAllocs()
	for b.Loop() {
		if _, _, _, err := self.Verifier(peer.Chain()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReceive: the whole receive path of one sealed publish packet
// of 100 figures (open, decode, with an Identity the checks and the
// signature, apply), each packet a newer seq.
func BenchmarkReceive(b *testing.B) {
	for _, signed := range []bool{false, true} {
		b.Run(fmt.Sprintf("signed=%v", signed), func(b *testing.B) {
			ca := newTestCA(b)
			selfSigner, self := ca.signer(b, "self")
			peerSigner, peer := ca.signer(b, "node-a")
			sealer, _ := newSealer(testKey, nil)
			c := &Mesh{cfg: Config{NodeName: "self"}, seal: sealer, chain: chainState{reqs: make(chan chainReq, 256)}}
			var ps *signer
			if signed {
				c.sign, ps = selfSigner, peerSigner
				c.keys = newKeyCache(self)
			}
			const batch = 1024
			pkts := make([][]byte, batch)
			var scratch []byte
			reset := func() {
				c.st = newState("self", time.Minute, time.Minute)
				c.st.signed = signed
				c.st.join("node-a")
				now := time.Now()
				for i := range pkts {
					msg := benchPacket(uint64(i + 1))
					if signed {
						msg, _ = ps.sign(nil, msg, now, &scratch)
						if i == 0 {
							c.keys.learn(peer.Chain(), now)
						}
					}
					pkts[i] = sealer.seal(nil, msg)
				}
			}
			recv := c.receivePacket()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if i%batch == 0 {
					b.StopTimer()
					reset()
					b.StartTimer()
				}
				recv(pkts[i%batch])
				i++
			}
			if got := c.st.build(nil).RemoteInFlight("gpu-16/"); got != 16 {
				b.Fatalf("gpu-16/ = %d", got)
			}
		})
	}
}

// BenchmarkOvercount replays, in one process, the fleet of the overcount
// report: three routers, at most three requests open in the whole fleet
// (three clients, each holding one request 5-45 ms on a random router,
// then pausing 0-10 ms), all to one backend. Every millisecond each
// router's view of the backend (own + remote) is compared with the
// fleet's true open count: over-% is the share of samples above it,
// ge4-% the share at 4 or more (impossible without stale figures),
// max-view the largest view seen. One op = one second of load.
func BenchmarkOvercount(b *testing.B) {
	const n = 3
	nodes := make([]*Mesh, n)
	srcs := make([]*fakeSource, n)
	for i := range n {
		cfg := testConfig(fmt.Sprintf("router-%c", 'a'+i))
		if i > 0 {
			cfg.Join = []string{nodes[0].Addr()}
		}
		srcs[i] = newFakeSource()
		c, err := New(cfg, srcs[i])
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		nodes[i] = c
	}
	waitFor(b, 20*time.Second, func() bool {
		for _, c := range nodes {
			if len(c.View().members) != n {
				return false
			}
		}
		return true
	}, "every node sees all %d members", n)

	var (
		mu  sync.Mutex // own and the sources change together
		own [n]int64
	)
	set := func(r int, d int64) {
		mu.Lock()
		own[r] += d
		srcs[r].set("x", own[r])
		mu.Unlock()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				r := rand.N(n)
				set(r, 1)
				time.Sleep(5*time.Millisecond + rand.N(40*time.Millisecond))
				set(r, -1)
				time.Sleep(rand.N(10 * time.Millisecond))
			}
		})
	}
	var samples, over, ge4, maxView int64
	b.ResetTimer()
	for b.Loop() {
		end := time.Now().Add(time.Second)
		for time.Now().Before(end) {
			time.Sleep(time.Millisecond)
			mu.Lock()
			fleet := own[0] + own[1] + own[2]
			for i, c := range nodes {
				v := own[i] + c.View().RemoteInFlight("x")
				samples++
				if v > fleet {
					over++
				}
				if v >= 4 {
					ge4++
				}
				maxView = max(maxView, v)
			}
			mu.Unlock()
		}
	}
	b.StopTimer()
	close(stop)
	wg.Wait()
	b.ReportMetric(100*float64(over)/float64(samples), "over-%")
	b.ReportMetric(100*float64(ge4)/float64(samples), "ge4-%")
	b.ReportMetric(float64(maxView), "max-view")
}
