package report

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// palette colours runs by label, in order of first appearance.
var palette = []string{"#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f"}

// fixedColours keeps the headline strategies the same colour everywhere.
var fixedColours = map[string]string{
	"RANDOM":                     "#d62728",
	"PREFIX_AWARE":               "#1f77b4",
	"ROUND_ROBIN":                "#ff7f0e",
	"LEAST_OUTSTANDING_REQUESTS": "#9467bd",
	"CONSISTENT_HASH":            "#2ca02c",
}

type xy struct{ X, Y float64 }

type series struct {
	Name   string
	Colour string
	Points []xy
}

type bars struct {
	Name   string
	Colour string
	Values []float64
}

const (
	chartW, chartH = 560, 300
	padL, padR     = 58, 16
	padT, padB     = 30, 62
)

func esc(s string) string { return html.EscapeString(s) }

// refStroke draws a reference line dashed also where the page's style
// sheet does not reach (a chart copied out of the report).
const refStroke = `stroke="#555" stroke-dasharray="4 3"`

// niceTicks returns about n round tick values covering [lo, hi].
func niceTicks(lo, hi float64, n int) []float64 {
	if !(hi > lo) {
		hi = lo + 1
	}
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step {
		out = append(out, v)
	}
	return out
}

// logTicks returns 1-2-5 ticks within [lo, hi] (lo > 0).
func logTicks(lo, hi float64) []float64 {
	var out []float64
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= lo*0.999 && v <= hi*1.001 {
				out = append(out, v)
			}
		}
	}
	return out
}

func tickLabel(v float64) string {
	switch {
	case v == 0:
		return "0"
	case math.Abs(v) >= 1000 && math.Mod(v, 1000) == 0:
		return fmt.Sprintf("%gk", v/1000)
	case math.Abs(v) >= 1:
		return fmt.Sprintf("%g", math.Round(v*100)/100)
	default:
		return fmt.Sprintf("%.2g", v)
	}
}

func svgOpen(b *strings.Builder, title string) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s">`,
		chartW, chartH, chartW, chartH, esc(title))
	fmt.Fprintf(b, `<text x="%d" y="18" class="title">%s</text>`, padL, esc(title))
}

// legend writes one swatch and name per series along the bottom edge,
// spaced by the names' estimated widths, in a smaller font when they
// would not fit on one line.
func legend(b *strings.Builder, names, colours []string) {
	const size = 11.0
	total := 0.0
	for _, n := range names {
		total += 24 + textWidth(n, size)
	}
	scale := 1.0
	if avail := float64(chartW - padL - padR); total > avail {
		scale = avail / total
	}
	x := float64(padL)
	y := chartH - 12
	for i, n := range names {
		fmt.Fprintf(b, `<rect x="%.1f" y="%d" width="10" height="10" fill="%s"/><text x="%.1f" y="%d" class="legend" font-size="%.1f">%s</text>`,
			x, y-9, colours[i], x+14, y, size*scale, esc(n))
		x += 24*scale + textWidth(n, size*scale)
	}
}

// textWidth estimates the width of s in pixels at a font size, generously
// (capitals as wide as in a serif fallback font), so that neighbouring
// labels do not overlap.
func textWidth(s string, size float64) float64 {
	w := 0.0
	for _, r := range s {
		switch {
		case r >= 'A' && r <= 'Z', r == 'W', r == 'm', r == 'w':
			w += 0.78
		case r == ' ', r == '.', r == ',', r == ':', r == 'i', r == 'l', r == '1':
			w += 0.35
		default:
			w += 0.6
		}
	}
	return w * size
}

// lineChart draws series on linear or logarithmic x and linear y axes.
// mark, when > 0, is an x position drawn as a dashed vertical line with
// markLabel.
func lineChart(title, xLabel, yLabel string, ss []series, logX bool, yLo, yHi float64, yPct bool, mark float64, markLabel string) string {
	var b strings.Builder
	svgOpen(&b, title)
	xLo, xHi := math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		for _, p := range s.Points {
			if logX && p.X <= 0 {
				continue
			}
			xLo, xHi = math.Min(xLo, p.X), math.Max(xHi, p.X)
		}
	}
	if math.IsInf(xLo, 0) {
		b.WriteString(`<text x="200" y="150" class="legend">no data</text></svg>`)
		return b.String()
	}
	if logX {
		xLo = math.Pow(10, math.Floor(math.Log10(xLo)))
		xHi = math.Pow(10, math.Ceil(math.Log10(xHi)))
	} else {
		ts := niceTicks(xLo, xHi, 6)
		xLo = math.Min(xLo, ts[0])
		xHi = math.Max(xHi, ts[len(ts)-1])
		if xLo > 0 {
			xLo = 0
		}
	}
	if xHi <= xLo {
		xHi = xLo + 1
	}
	pw := float64(chartW - padL - padR)
	ph := float64(chartH - padT - padB)
	px := func(x float64) float64 {
		if logX {
			return float64(padL) + pw*(math.Log10(x)-math.Log10(xLo))/(math.Log10(xHi)-math.Log10(xLo))
		}
		return float64(padL) + pw*(x-xLo)/(xHi-xLo)
	}
	py := func(y float64) float64 { return float64(padT) + ph*(1-(y-yLo)/(yHi-yLo)) }

	xt := niceTicks(xLo, xHi, 6)
	if logX {
		xt = logTicks(xLo, xHi)
	}
	for _, t := range xt {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" class="grid"/><text x="%.1f" y="%.1f" class="tick" text-anchor="middle">%s</text>`,
			px(t), padT, px(t), float64(padT)+ph, px(t), float64(padT)+ph+14, tickLabel(t))
	}
	for _, t := range niceTicks(yLo, yHi, 5) {
		lbl := tickLabel(t)
		if yPct {
			lbl = fmt.Sprintf("%.0f%%", 100*t)
		}
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" class="grid"/><text x="%d" y="%.1f" class="tick" text-anchor="end">%s</text>`,
			padL, py(t), float64(padL)+pw, py(t), padL-4, py(t)+4, lbl)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="axis" text-anchor="middle">%s</text>`, float64(padL)+pw/2, float64(padT)+ph+30, esc(xLabel))
	fmt.Fprintf(&b, `<text x="14" y="%.1f" class="axis" text-anchor="middle" transform="rotate(-90 14 %.1f)">%s</text>`, float64(padT)+ph/2, float64(padT)+ph/2, esc(yLabel))
	if mark > xLo && mark < xHi {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" class="ref" %s/><text x="%.1f" y="%d" class="tick">%s</text>`,
			px(mark), padT, px(mark), float64(padT)+ph, refStroke, px(mark)+4, padT+10, esc(markLabel))
	}
	names := make([]string, len(ss))
	colours := make([]string, len(ss))
	for i, s := range ss {
		names[i], colours[i] = s.Name, s.Colour
		var pts []string
		for _, p := range s.Points {
			if logX && p.X <= 0 {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(p.X), py(p.Y)))
		}
		if len(pts) == 1 {
			fmt.Fprintf(&b, `<circle cx="%s" r="3" fill="%s"/>`, strings.Replace(pts[0], ",", `" cy="`, 1), s.Colour)
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, s.Colour, strings.Join(pts, " "))
	}
	legend(&b, names, colours)
	b.WriteString(`</svg>`)
	return b.String()
}

// barChart draws grouped bars: one group per category, one bar per series.
// ref, when > 0, is drawn as a dashed horizontal line (the even share)
// labelled refLabel.
func barChart(title, yLabel string, categories []string, bs []bars, ref float64, refLabel string) string {
	var b strings.Builder
	svgOpen(&b, title)
	hi := ref
	for _, s := range bs {
		for _, v := range s.Values {
			hi = math.Max(hi, v)
		}
	}
	if hi <= 0 || len(categories) == 0 || len(bs) == 0 {
		b.WriteString(`<text x="200" y="150" class="legend">no data</text></svg>`)
		return b.String()
	}
	ticks := niceTicks(0, hi*1.05, 5)
	yHi := ticks[len(ticks)-1]
	if yHi < hi*1.05 && len(ticks) > 1 {
		yHi += ticks[1] - ticks[0]
		ticks = append(ticks, yHi)
	}
	pw := float64(chartW - padL - padR)
	ph := float64(chartH - padT - padB)
	py := func(y float64) float64 { return float64(padT) + ph*(1-y/yHi) }
	for _, t := range ticks {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" class="grid"/><text x="%d" y="%.1f" class="tick" text-anchor="end">%.0f%%</text>`,
			padL, py(t), float64(padL)+pw, py(t), padL-4, py(t)+4, 100*t)
	}
	group := pw / float64(len(categories))
	barW := group * 0.8 / float64(len(bs))
	for ci, c := range categories {
		x0 := float64(padL) + group*float64(ci) + group*0.1
		for si, s := range bs {
			v := 0.0
			if ci < len(s.Values) {
				v = s.Values[ci]
			}
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %.1f%%</title></rect>`,
				x0+barW*float64(si), py(v), math.Max(barW-1, 1), float64(padT)+ph-py(v), s.Colour, esc(s.Name), esc(c), 100*v)
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="tick" text-anchor="middle">%s</text>`,
			x0+group*0.4, float64(padT)+ph+14, esc(c))
	}
	if ref > 0 {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" class="ref" %s/>`, padL, py(ref), float64(padL)+pw, py(ref), refStroke)
		if refLabel != "" {
			// The key to the dashed line, under the categories (where a
			// line chart has its axis label), clear of the bars.
			y := float64(padT) + ph + 30
			x := float64(padL) + pw/2 - (28+textWidth(refLabel, 11))/2
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" class="ref" %s/><text x="%.1f" y="%.1f" class="axis">%s</text>`,
				x, y-4, x+24, y-4, refStroke, x+28, y, esc(refLabel))
		}
	}
	fmt.Fprintf(&b, `<text x="14" y="%.1f" class="axis" text-anchor="middle" transform="rotate(-90 14 %.1f)">%s</text>`, float64(padT)+ph/2, float64(padT)+ph/2, esc(yLabel))
	names := make([]string, len(bs))
	colours := make([]string, len(bs))
	for i, s := range bs {
		names[i], colours[i] = s.Name, s.Colour
	}
	legend(&b, names, colours)
	b.WriteString(`</svg>`)
	return b.String()
}
