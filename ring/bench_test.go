package ring

import (
	"fmt"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cpuTime is this process's user+system CPU time. Benchmarks report it per
// operation next to ns/op: on a shared machine wall time includes waiting
// for a core, CPU time does not.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func chatBody(promptBytes int) []byte {
	text := strings.Repeat("Retrieved document text, with some punctuation; and words. ", promptBytes/50+1)[:promptBytes]
	return []byte(fmt.Sprintf(`{"model":"meta-llama/Llama-3.1-70B-Instruct","stream":true,"temperature":0.2,"messages":[{"role":"system","content":"You answer questions about the document."},{"role":"user","content":%q}]}`, text))
}

// BenchmarkRoute is the routing decision on the request path: key
// extraction plus Pick, for prompts from 1 KiB to 64 KiB.
func BenchmarkRoute(b *testing.B) {
	r := mustRing(b, DefaultConfig(), gpus(7))
	loads := newLoads(7)
	for _, size := range []int{1 << 10, 4 << 10, 16 << 10, 64 << 10} {
		body := chatBody(size)
		for _, plen := range []int{4096, 65536} {
			cfg := r.Config().Key()
			cfg.PrefixLength = plen
			b.Run(fmt.Sprintf("prompt=%dKiB/prefix=%d", size>>10, plen), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				var info KeyInfo
				start := cpuTime()
				for b.Loop() {
					if err := Extract(cfg, Chat, body, nil, &info); err != nil {
						b.Fatal(err)
					}
					if _, err := r.Pick(info.Key, loads); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

// BenchmarkPick is Pick alone, on an idle fleet and on one where every
// backend has 2 requests in flight (with LoadFactor, a busy owner needs
// the fleet's total; an idle one does not). totals=walk sums the fleet on
// each such pick; totals=kept reads the sums a Tally keeps (LoadTotals),
// as the proxy's loads do.
func BenchmarkPick(b *testing.B) {
	for _, n := range []int{7, 100, 1000} {
		for _, lf := range []float64{0, 1.25} {
			for _, inflight := range []int64{0, 2} {
				if lf == 0 && inflight > 0 {
					continue
				}
				cfg := DefaultConfig()
				cfg.LoadFactor = lf
				r := mustRing(b, cfg, gpus(n))
				kept := newKeptLoads(n)
				for i := 0; i < n; i++ {
					kept.set(i, inflight)
				}
				for _, totals := range []string{"walk", "kept"} {
					var loads Loads = kept
					if totals == "walk" {
						loads = walkedLoads{kept}
					}
					b.Run(fmt.Sprintf("backends=%d/loadfactor=%g/inflight=%d/totals=%s", n, lf, inflight, totals), func(b *testing.B) {
						b.ReportAllocs()
						k := uint64(0)
						start := cpuTime()
						for b.Loop() {
							k += 0x9e3779b97f4a7c15
							if _, err := r.Pick(k, loads); err != nil {
								b.Fatal(err)
							}
						}
						b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
					})
				}
			}
		}
	}
}

// BenchmarkNewRebuild is a ring rebuild (New): what every membership or
// config change costs. retained-B is the heap a built ring keeps
// (partition table, overflow orders, index), measured once after a GC;
// cpu-ns/op is the process's CPU time per rebuild.
func BenchmarkNewRebuild(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		bs := gpus(n)
		b.Run(fmt.Sprintf("backends=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			keep := retained(b, bs)
			start := cpuTime()
			for b.Loop() {
				if _, err := New(DefaultConfig(), bs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(keep), "retained-B")
		})
	}
}

// BenchmarkRebuild is a membership change to n backends: Rebuild from a
// ring over n-1 where one joins, or over n+1 where one leaves.
// BenchmarkNewRebuild builds the same ring from scratch.
func BenchmarkRebuild(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		bs := gpus(n + 1)
		for _, c := range []struct {
			name string
			from []Backend
		}{{"join", bs[:n-1]}, {"leave", bs}} {
			prev, err := New(DefaultConfig(), c.from)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(fmt.Sprintf("backends=%d/%s", n, c.name), func(b *testing.B) {
				b.ReportAllocs()
				start := cpuTime()
				for b.Loop() {
					if _, err := prev.Rebuild(DefaultConfig(), bs[:n]); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

// retained is the live heap one ring over bs holds.
func retained(b *testing.B, bs []Backend) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	r, err := New(DefaultConfig(), bs)
	if err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(r)
	if after.HeapAlloc < before.HeapAlloc {
		return 0
	}
	return after.HeapAlloc - before.HeapAlloc
}

// BenchmarkRouteAdaptive is the routing decision under ADAPTIVE keys: the
// block chain read to the depth the splits call for, the depth chosen and
// Pick. "splits=0" reads 8 blocks (no split); "splits=12" routes past a
// 12 KiB preamble split block by block, reading 17.
func BenchmarkRouteAdaptive(b *testing.B) {
	r := mustRing(b, DefaultConfig(), gpus(7))
	loads := newLoads(7)
	for _, size := range []int{1 << 10, 16 << 10, 64 << 10} {
		body := chatBody(size)
		for _, nsplit := range []int{0, 12} {
			var info KeyInfo
			if err := Extract(KeyConfig{ChainBlocks: MaxChainBlocks}, Chat, body, nil, &info); err != nil {
				b.Fatal(err)
			}
			var list []Split
			for d := 0; d < nsplit && d < info.Blocks; d++ {
				list = append(list, Split{Key: info.KeyAt(d), Depth: d})
			}
			splits, err := NewSplits(list)
			if err != nil {
				b.Fatal(err)
			}
			cfg := r.Config().Key()
			cfg.ChainBlocks = splits.ChainBlocks()
			b.Run(fmt.Sprintf("prompt=%dKiB/splits=%d", size>>10, len(list)), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				start := cpuTime()
				for b.Loop() {
					if err := Extract(cfg, Chat, body, nil, &info); err != nil {
						b.Fatal(err)
					}
					splits.Route(&info)
					if _, err := r.PickCost(info.Key, 1, loads); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}
