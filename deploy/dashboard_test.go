package deploy

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/proxy/engine"
)

// validate checks what the dashboard must do beyond its shape:
//   - read every engine's names for the figures the router scrapes (vLLM,
//     SGLang and TGI, as proxy/engine's DefaultMapping knows them), not
//     only vLLM's;
//   - work without the node label the project's own scrape configs add:
//     no query, legend or variable needs it (Prometheus always adds
//     instance, so the router variable and legends use that);
//   - count no 4xx answer in the affinity share (a refused request was
//     never routed);
//   - keep messages and bytes apart: a panel plots one kind, in its unit;
//   - never paint a lone router red: one member is a valid cluster;
//   - show predicted against delivered per decision kind (the share of
//     answers predicted warm and delivered warm, and the tokens cached),
//     counting no answer without a usage report in a hit rate: its
//     delivery is unknown.
func (d *dashboard) validate() []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	all := strings.Join(d.exprs(), "\n")

	m := engine.DefaultMapping()
	want := slices.Concat(m.KVUsage, m.Running, m.Waiting, m.PrefixHitRate, m.PrefixQueries[:1], m.PrefixHits[:1])
	for _, n := range want {
		if !regexp.MustCompile(regexp.QuoteMeta(n) + `\b`).MatchString(all) {
			bad("no panel reads the engine metric %s", n)
		}
	}

	nodeLabel := regexp.MustCompile(`\bnode\b`)
	for _, v := range d.Templating.List {
		if nodeLabel.Match(v.Query) || nodeLabel.MatchString(v.Definition) {
			bad("variable %s reads the node label", v.Name)
		}
	}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			if nodeLabel.MatchString(tg.Expr) {
				bad("panel %q: query needs the node label: %s", p.Title, tg.Expr)
			}
			if strings.Contains(tg.LegendFormat, "{{node}}") {
				bad("panel %q: legend shows the node label", p.Title)
			}
		}
	}

	requests := regexp.MustCompile(`warmroute_requests_total(\{[^}]*\})?`)
	affinity := 0
	for _, e := range d.exprs() {
		if !strings.Contains(e, `decision="affinity"`) {
			continue
		}
		affinity++
		for _, sel := range requests.FindAllString(e, -1) {
			if !strings.Contains(sel, `code!~"4.."`) {
				bad("affinity share counts 4xx answers: %s in %s", sel, e)
			}
		}
	}
	if affinity == 0 {
		bad("no panel shows the affinity share")
	}

	cacheAnswers := regexp.MustCompile(`warmroute_cache_answers_total(\{[^}]*\})?`)
	checked := regexp.MustCompile(`delivered(!="unknown"|="warm"|="cold")`)
	var predicted, delivered, tokens bool
	for _, e := range d.exprs() {
		sels := cacheAnswers.FindAllString(e, -1)
		for _, sel := range sels {
			if !checked.MatchString(sel) {
				bad("a hit rate counts answers without a usage report: %s in %s", sel, e)
			}
		}
		byKind := strings.Contains(e, "by (kind)")
		predicted = predicted || (byKind && len(sels) > 0 && strings.Contains(e, `predicted="warm"`))
		delivered = delivered || (byKind && len(sels) > 0 && strings.Contains(e, `delivered="warm"`))
		tokens = tokens || (byKind && strings.Contains(e, "warmroute_cache_cached_tokens_total") && strings.Contains(e, "warmroute_cache_prompt_tokens_total"))
	}
	if !predicted || !delivered || !tokens {
		bad("no panel shows per decision kind what was predicted warm (%v), delivered warm (%v) and the tokens cached (%v)", predicted, delivered, tokens)
	}

	bytesUnits := []string{"bytes", "decbytes", "Bps", "binBps", "KBs", "MBs"}
	for _, p := range d.Panels {
		var kinds []string
		for _, tg := range p.Targets {
			for _, n := range metricName.FindAllString(tg.Expr, -1) {
				k := "other"
				if strings.Contains(n, "_bytes") {
					k = "bytes"
				}
				if !slices.Contains(kinds, k) {
					kinds = append(kinds, k)
				}
			}
		}
		switch {
		case len(kinds) > 1:
			bad("panel %q plots bytes and other figures on one axis", p.Title)
		case len(kinds) == 1 && kinds[0] == "bytes" && !slices.Contains(bytesUnits, p.FieldConfig.Defaults.Unit):
			bad("panel %q plots bytes in unit %q", p.Title, p.FieldConfig.Defaults.Unit)
		}
	}

	for _, p := range d.Panels {
		if p.Type != "stat" && p.Type != "gauge" {
			continue
		}
		counts := false
		for _, tg := range p.Targets {
			counts = counts || strings.Contains(tg.Expr, "warmroute_gossip_members")
		}
		if !counts {
			continue
		}
		if c := thresholdColour(p, 1); strings.Contains(c, "red") {
			bad("panel %q shows one router as %s", p.Title, c)
		}
	}
	return errs
}

// otherEngineNames are the engine metrics the dashboard may read that
// gpusim does not export (vLLM V0's, SGLang's, TGI's): those the router's
// scraper reads, and SGLang's TTFT histogram.
func otherEngineNames() []string {
	m := engine.DefaultMapping()
	return slices.Concat(m.KVUsage, m.Running, m.Waiting, m.PrefixHitRate, m.PrefixQueries, m.PrefixHits,
		[]string{"sglang:time_to_first_token_seconds_bucket"})
}

// thresholdColour is the colour a panel's thresholds give value v.
func thresholdColour(p panel, v float64) string {
	c := ""
	for _, s := range p.FieldConfig.Defaults.Thresholds.Steps {
		if s.Value == nil || *s.Value <= v {
			c = s.Color
		}
	}
	return c
}

func TestDashboardCoversEnginesAndClusters(t *testing.T) {
	for _, err := range loadDashboard(t).validate() {
		t.Error(err)
	}
}

// TestDashboardChecksCatchDefects breaks the dashboard the ways it once
// was broken and expects validate to notice each.
func TestDashboardChecksCatchDefects(t *testing.T) {
	find := func(d *dashboard, sub string) (*panel, int) {
		for i := range d.Panels {
			for j, tg := range d.Panels[i].Targets {
				if strings.Contains(tg.Expr, sub) {
					return &d.Panels[i], j
				}
			}
		}
		t.Fatalf("no query reads %s", sub)
		return nil, 0
	}
	checkBreakers(t, loadDashboard, map[string]func(*dashboard){
		"vLLM names only": func(d *dashboard) {
			for i := range d.Panels {
				for j := range d.Panels[i].Targets {
					e := &d.Panels[i].Targets[j].Expr
					*e = regexp.MustCompile(`\|?(sglang:|tgi_)[a-z_]+`).ReplaceAllString(*e, "")
				}
			}
		},
		"node filter": func(d *dashboard) {
			p, j := find(d, "warmroute_ring_epoch")
			p.Targets[j].Expr = `max(warmroute_ring_epoch{node=~"$node"})`
		},
		"node legend": func(d *dashboard) {
			p, j := find(d, "warmroute_gossip_members")
			p.Targets[j].LegendFormat = "{{node}}"
		},
		"4xx in the affinity share": func(d *dashboard) {
			p, j := find(d, `decision="affinity"`)
			p.Targets[j].Expr = strings.ReplaceAll(p.Targets[j].Expr, `,code!~"4.."`, "")
		},
		"messages and bytes together": func(d *dashboard) {
			p, _ := find(d, "warmroute_gossip_messages_sent_total")
			b, j := find(d, "warmroute_gossip_bytes_sent_total")
			p.Targets = append(p.Targets, b.Targets[j])
		},
		"unknown deliveries in a hit rate": func(d *dashboard) {
			p, j := find(d, `delivered!="unknown"`)
			p.Targets[j].Expr = strings.ReplaceAll(p.Targets[j].Expr, `,delivered!="unknown"`, "")
		},
		"predictions not per kind": func(d *dashboard) {
			for i := range d.Panels {
				for j := range d.Panels[i].Targets {
					e := &d.Panels[i].Targets[j].Expr
					if strings.Contains(*e, "warmroute_cache_answers_total") {
						*e = strings.ReplaceAll(*e, "by (kind) ", "")
					}
				}
			}
		},
		"one router red": func(d *dashboard) {
			// The thresholds it had: red below 2 members, orange below 3.
			p, _ := find(d, "warmroute_gossip_members")
			two, three := 2.0, 3.0
			p.FieldConfig.Defaults.Thresholds.Steps = []thresholdStep{{"red", nil}, {"orange", &two}, {"green", &three}}
		},
	})
}
