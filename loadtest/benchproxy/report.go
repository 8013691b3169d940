package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// run is one measured wrk run against one target.
type run struct {
	Rep    int           `json:"rep"`
	Target string        `json:"target"`
	Conns  int           `json:"conns"`
	Wrk    wrkResult     `json:"wrk"`
	RPS    float64       `json:"rps"`
	P50    time.Duration `json:"p50_ns"`
	P99    time.Duration `json:"p99_ns"`
	// CPU is the proxy's CPU time during the run; CPUPerReq divides it by
	// the requests completed.
	CPU       time.Duration `json:"cpu_ns"`
	CPUPerReq time.Duration `json:"cpu_per_req_ns"`
	// StubCPUPerReq is the stub backends' CPU per request.
	StubCPUPerReq time.Duration `json:"stub_cpu_per_req_ns"`
	// OtherSUTBusy is the share of the SUT's cores that other processes
	// used during the run.
	OtherSUTBusy float64 `json:"other_sut_busy"`
	// GenBusy is how busy the load generator's cores were (wrk and the
	// stubs, and anything else there): near 100%, the run measured the
	// generator's limit as much as the proxy's.
	GenBusy float64 `json:"gen_busy"`
}

// streamRun is the streaming measurement of one target in one repetition.
type streamRun struct {
	Rep      int           `json:"rep"`
	Target   string        `json:"target"`
	Engine   string        `json:"engine"`
	N        int           `json:"n"`
	Events   int           `json:"events"`
	FirstP50 time.Duration `json:"first_p50_ns"`
	FirstP90 time.Duration `json:"first_p90_ns"`
	TotalP50 time.Duration `json:"total_p50_ns"`
}

// spread is a median over repetitions and the range around it.
type spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func spreadOf(v []float64) spread {
	if len(v) == 0 {
		return spread{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return spread{Median: m, Min: s[0], Max: s[len(s)-1]}
}

func (s spread) fmt(prec int, unit string) string {
	if s.Min == s.Max {
		return strconv.FormatFloat(s.Median, 'f', prec, 64) + unit
	}
	return fmt.Sprintf("%.*f%s (%.*f-%.*f)", prec, s.Median, unit, prec, s.Min, prec, s.Max)
}

// row summarises one target at one concurrency over the repetitions.
type row struct {
	Target    string `json:"target"`
	Conns     int    `json:"conns"`
	RPS       spread `json:"rps"`
	P50us     spread `json:"p50_us"`
	P99us     spread `json:"p99_us"`
	AddedP50  spread `json:"added_p50_us"`
	CPUus     spread `json:"cpu_per_req_us"`
	StubCPUus spread `json:"stub_cpu_per_req_us"`
	GenBusy   spread `json:"gen_busy_pct"`
}

// ratio is a warmroute/HAProxy ratio over repetitions, with its target.
type ratio struct {
	Name   string  `json:"name"`
	Spread spread  `json:"spread"`
	Goal   string  `json:"goal"`
	Met    bool    `json:"met"`
	Bound  float64 `json:"bound"`
	le     bool
}

type streamRow struct {
	Target   string `json:"target"`
	Engine   string `json:"engine"`
	FirstP50 spread `json:"first_p50_ms"`
	FirstP90 spread `json:"first_p90_ms"`
	Delta    spread `json:"delta_p50_vs_direct_ms"`
	TotalP50 spread `json:"total_p50_ms"`
}

// results is everything one run measured.
type results struct {
	Started        time.Time   `json:"started"`
	Command        string      `json:"command"`
	Options        options     `json:"options"`
	HAProxyVersion string      `json:"haproxy_version"`
	CPU            string      `json:"cpu"`
	LoadAvgStart   string      `json:"loadavg_start"`
	LoadAvgEnd     string      `json:"loadavg_end"`
	Runs           []run       `json:"runs"`
	Streams        []streamRun `json:"streams"`
	Rows           []row       `json:"rows"`
	Ratios         []ratio     `json:"ratios"`
	StreamRows     []streamRow `json:"stream_rows"`
	Open           []openRun   `json:"open,omitempty"`
	OpenRows       []openRow   `json:"open_rows,omitempty"`
	OpenRatios     []openRatio `json:"open_ratios,omitempty"`
	Long           []longRun   `json:"long,omitempty"`
	LongRows       []longRow   `json:"long_rows,omitempty"`
	LongRatios     []longRatio `json:"long_ratios,omitempty"`
}

func (r *results) targetNames() []string {
	names := []string{"direct", "haproxy", "warmroute"}
	if r.Options.Baseline != "" {
		names = append(names, "baseline")
	}
	return names
}

func (r *results) find(rep int, tgt string, conns int) (run, bool) {
	return firstWhere(r.Runs, func(x run) bool { return x.Rep == rep && x.Target == tgt && x.Conns == conns })
}

// firstWhere returns the first element of xs for which ok holds.
func firstWhere[T any](xs []T, ok func(T) bool) (T, bool) {
	if i := slices.IndexFunc(xs, ok); i >= 0 {
		return xs[i], true
	}
	var zero T
	return zero, false
}

func (r *results) summarise() {
	reps := r.Options.Reps
	for _, tgt := range r.targetNames() {
		for _, c := range r.Options.Conns {
			var rps, p50, p99, added, cpu, stub, gen []float64
			for rep := 0; rep < reps; rep++ {
				x, ok := r.find(rep, tgt, c)
				if !ok {
					continue
				}
				rps = append(rps, x.RPS)
				p50 = append(p50, us(x.P50))
				p99 = append(p99, us(x.P99))
				cpu = append(cpu, us(x.CPUPerReq))
				stub = append(stub, us(x.StubCPUPerReq))
				gen = append(gen, 100*x.GenBusy)
				if d, ok := r.find(rep, "direct", c); ok {
					added = append(added, us(x.P50-d.P50))
				}
			}
			if len(rps) == 0 {
				continue
			}
			r.Rows = append(r.Rows, row{Target: tgt, Conns: c, RPS: spreadOf(rps), P50us: spreadOf(p50),
				P99us: spreadOf(p99), AddedP50: spreadOf(added), CPUus: spreadOf(cpu), StubCPUus: spreadOf(stub),
				GenBusy: spreadOf(gen)})
		}
	}
	perRep := func(f func(w, h, d run) (float64, bool), c int) []float64 {
		var v []float64
		for rep := 0; rep < reps; rep++ {
			w, ok1 := r.find(rep, "warmroute", c)
			h, ok2 := r.find(rep, "haproxy", c)
			d, ok3 := r.find(rep, "direct", c)
			if ok1 && ok2 && ok3 {
				if x, ok := f(w, h, d); ok {
					v = append(v, x)
				}
			}
		}
		return v
	}
	add := func(name string, v []float64, bound float64, le bool) {
		if len(v) == 0 {
			return
		}
		s := spreadOf(v)
		goal := fmt.Sprintf(">= %.2f", bound)
		met := s.Median >= bound
		if le {
			goal = fmt.Sprintf("<= %.2f", bound)
			met = s.Median <= bound
		}
		r.Ratios = append(r.Ratios, ratio{Name: name, Spread: s, Goal: goal, Met: met, Bound: bound, le: le})
	}
	cpuRatio := func(w, h, _ run) (float64, bool) {
		return float64(w.CPUPerReq) / float64(h.CPUPerReq), h.CPUPerReq > 0
	}
	for _, c := range r.Options.Conns {
		add(fmt.Sprintf("CPU per request, c=%d", c), perRep(cpuRatio, c), 0.8, true)
	}
	for _, c := range r.Options.Conns {
		if c == 1 {
			continue
		}
		add(fmt.Sprintf("throughput, c=%d", c), perRep(func(w, h, _ run) (float64, bool) { return w.RPS / h.RPS, h.RPS > 0 }, c), 1.1, false)
	}
	if slices.Contains(r.Options.Conns, 1) {
		add("added p50 latency, c=1", perRep(func(w, h, d run) (float64, bool) {
			hd := h.P50 - d.P50
			return float64(w.P50-d.P50) / float64(hd), hd > 0
		}, 1), 1.0, true)
	}
	// Streams, per engine style.
	for _, engine := range []string{engineStyle(false), engineStyle(true)} {
		r.summariseStreams(engine)
	}
	r.summariseOpen()
	r.summariseLong()
}

func (r *results) summariseStreams(engine string) {
	byRep := map[int]map[string]streamRun{}
	for _, s := range r.Streams {
		if s.Engine != engine {
			continue
		}
		if byRep[s.Rep] == nil {
			byRep[s.Rep] = map[string]streamRun{}
		}
		byRep[s.Rep][s.Target] = s
	}
	for _, tgt := range r.targetNames() {
		var f50, f90, delta, tot []float64
		for _, m := range byRep {
			s, ok := m[tgt]
			if !ok {
				continue
			}
			f50 = append(f50, ms(s.FirstP50))
			f90 = append(f90, ms(s.FirstP90))
			tot = append(tot, ms(s.TotalP50))
			if d, ok := m["direct"]; ok {
				delta = append(delta, ms(s.FirstP50-d.FirstP50))
			}
		}
		if len(f50) > 0 {
			r.StreamRows = append(r.StreamRows, streamRow{Target: tgt, Engine: engine, FirstP50: spreadOf(f50), FirstP90: spreadOf(f90), Delta: spreadOf(delta), TotalP50: spreadOf(tot)})
		}
	}
}

func (r *results) text() string {
	var b strings.Builder
	if len(r.Rows) > 0 {
		r.wrkText(&b)
	}
	if len(r.StreamRows) > 0 {
		fmt.Fprintf(&b, "\nStreaming (%d SSE chunks, %s prefill, %d streams per target per repetition)\n",
			r.Options.StreamChunks, r.Options.StreamPrefill, r.Options.Streams)
		fmt.Fprintf(&b, "%-26s %-10s %-26s %-26s %-26s\n", "engine", "target", "first chunk p50 ms", "first chunk p90 ms", "p50 vs direct ms")
		for _, s := range r.StreamRows {
			fmt.Fprintf(&b, "%-26s %-10s %-26s %-26s %-26s\n", s.Engine, s.Target, s.FirstP50.fmt(3, ""), s.FirstP90.fmt(3, ""), s.Delta.fmt(3, ""))
		}
	}
	if len(r.OpenRows) > 0 {
		r.openText(&b)
	}
	if len(r.LongRows) > 0 {
		r.longText(&b)
	}
	fmt.Fprintf(&b, "\nload average: start %s, end %s\n", r.LoadAvgStart, r.LoadAvgEnd)
	return b.String()
}

func (r *results) wrkText(b *strings.Builder) {
	fmt.Fprintf(b, "Summary: median over %d repetitions (min-max); %s, %d backends, %d-byte bodies, %d prefixes, %ds runs\n",
		r.Options.Reps, r.HAProxyVersion, r.Options.Backends, r.Options.BodySize, r.Options.Prefixes, int(r.Options.Duration.Seconds()))
	fmt.Fprintf(b, "%-10s %4s  %-26s %-24s %-26s %-24s %-24s %-16s\n", "target", "conc", "req/s", "p50 us", "p99 us", "added p50 us", "proxy CPU us/req", "generator busy %")
	for _, x := range r.Rows {
		cpu := x.CPUus.fmt(2, "")
		if x.Target == "direct" {
			cpu = "-"
		}
		fmt.Fprintf(b, "%-10s %4d  %-26s %-24s %-26s %-24s %-24s %-16s\n", x.Target, x.Conns, x.RPS.fmt(0, ""), x.P50us.fmt(1, ""),
			x.P99us.fmt(1, ""), x.AddedP50.fmt(1, ""), cpu, x.GenBusy.fmt(0, ""))
	}
	b.WriteString("\nwarmroute / HAProxy (per repetition, then median and range)\n")
	for _, q := range r.Ratios {
		met := "met"
		if !q.Met {
			met = "NOT met"
		}
		fmt.Fprintf(b, "  %-26s %-22s goal %s: %s\n", q.Name, q.Spread.fmt(2, ""), q.Goal, met)
	}
}

func (r *results) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Run %s, %s, %s.", r.Started.Format(time.RFC3339), r.CPU, r.HAProxyVersion)
	if len(r.Rows) > 0 || len(r.StreamRows) > 0 {
		fmt.Fprintf(&b, " Median over %d repetitions, range in brackets.", r.Options.Reps)
	}
	b.WriteString("\n")
	if len(r.Rows) > 0 {
		r.wrkMarkdown(&b)
	}
	if len(r.StreamRows) > 0 {
		b.WriteString("\n| engine | streaming through | first chunk p50 ms | first chunk p90 ms | p50 vs direct ms |\n|---|---|---|---|---|\n")
		for _, s := range r.StreamRows {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", s.Engine, s.Target, s.FirstP50.fmt(3, ""), s.FirstP90.fmt(3, ""), s.Delta.fmt(3, ""))
		}
	}
	if len(r.OpenRows) > 0 {
		r.openMarkdown(&b)
	}
	if len(r.LongRows) > 0 {
		r.longMarkdown(&b)
	}
	fmt.Fprintf(&b, "\nLoad average at start %s, at end %s.\n", r.LoadAvgStart, r.LoadAvgEnd)
	return b.String()
}

func (r *results) wrkMarkdown(b *strings.Builder) {
	b.WriteString("\n| target | concurrency | req/s | p50 us | p99 us | added p50 us | proxy CPU us/req | generator busy % |\n|---|---|---|---|---|---|---|---|\n")
	for _, x := range r.Rows {
		cpu := x.CPUus.fmt(2, "")
		if x.Target == "direct" {
			cpu = "-"
		}
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %s | %s |\n", x.Target, x.Conns, x.RPS.fmt(0, ""), x.P50us.fmt(1, ""), x.P99us.fmt(1, ""), x.AddedP50.fmt(1, ""), cpu, x.GenBusy.fmt(0, ""))
	}
	b.WriteString("\n| warmroute / HAProxy | ratio | goal | |\n|---|---|---|---|\n")
	for _, q := range r.Ratios {
		met := "met"
		if !q.Met {
			met = "not met"
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", q.Name, q.Spread.fmt(2, ""), q.Goal, met)
	}
}

func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(0, min(len(s)-1, i-1))]
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "?"
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	n := 0
	model := "?"
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name":
			model = strings.TrimSpace(v)
		case "processor":
			n++
		}
	}
	return fmt.Sprintf("%d x %s", n, model)
}

// busyTime is busy and total time of a set of CPUs from /proc/stat.
type busyTime struct{ busy, total time.Duration }

func (a busyTime) sub(b busyTime) busyTime { return busyTime{a.busy - b.busy, a.total - b.total} }

// cpusBusy sums /proc/stat lines of the CPUs in list ("0", "0,2", "0-1").
func cpusBusy(list string) (busyTime, error) {
	want, err := parseCPUList(list)
	if err != nil {
		return busyTime{}, err
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return busyTime{}, err
	}
	var out busyTime
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 8 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		n, err := strconv.Atoi(f[0][3:])
		if err != nil || !want[n] {
			continue
		}
		var v [8]int64
		for i := range v {
			v[i], _ = strconv.ParseInt(f[i+1], 10, 64)
		}
		// user nice system idle iowait irq softirq steal
		idle := v[3] + v[4]
		var total int64
		for _, x := range v {
			total += x
		}
		out.busy += time.Duration(total-idle) * clockTick
		out.total += time.Duration(total) * clockTick
	}
	return out, nil
}

func parseCPUList(s string) (map[int]bool, error) {
	out := map[int]bool{}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("bad cpu list %q", s)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("bad cpu list %q", s)
			}
		}
		for i := a; i <= b; i++ {
			out[i] = true
		}
	}
	return out, nil
}
