package benchmarks

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// A minimal SVG line/bar chart writer: enough for the report's four
// plots without a plotting dependency.

var palette = map[string]string{
	ModeArbor: "#1b7837", ModeFull: "#c51b7d", ModeFSOnly: "#2166ac", ModeReplay: "#8c510a", "runc": "#e08214", ModeArborZFS: "#762a83", ModeArborPrepared: "#7fbc41",
}

var kindColor = map[string]string{"none": "#bababa", "fs": "#4393c3", "proc": "#f4a582", "full": "#b2182b"}

type series struct {
	name   string
	color  string
	xs, ys []float64
	step   bool // draw as a step function (CDF)
}

type chart struct {
	title, xlabel, ylabel string
	logX                  bool
	xticks                []float64
	series                []series
}

const (
	svgW, svgH                     = 640, 400
	padL, padR, padT, padB float64 = 70, 150, 40, 50
)

func (c chart) render() string {
	var minX, maxX, maxY = math.Inf(1), math.Inf(-1), 0.0
	for _, s := range c.series {
		for i := range s.xs {
			x := s.xs[i]
			if c.logX && x <= 0 {
				continue
			}
			minX, maxX, maxY = math.Min(minX, x), math.Max(maxX, x), math.Max(maxY, s.ys[i])
		}
	}
	if math.IsInf(minX, 1) {
		minX, maxX = 0, 1
		if c.logX {
			// No data (arbor bench --branch-only has no checkpoint
			// latencies): a log axis from 0 made the ticks loop from
			// -Inf for ever, allocating until the OOM killer came.
			minX, maxX = 1, 10
		}
	}
	if maxY == 0 {
		maxY = 1
	}
	maxY = niceCeil(maxY)
	tx := func(x float64) float64 {
		if c.logX {
			lo, hi := math.Log10(minX), math.Log10(maxX)
			if hi == lo {
				hi = lo + 1
			}
			return padL + (math.Log10(math.Max(x, minX))-lo)/(hi-lo)*(svgW-padL-padR)
		}
		if maxX == minX {
			maxX = minX + 1
		}
		return padL + (x-minX)/(maxX-minX)*(svgW-padL-padR)
	}
	ty := func(y float64) float64 { return svgH - padB - y/maxY*(svgH-padT-padB) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", svgW, svgH, svgW, svgH)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" text-anchor="middle" font-size="15">%s</text>`+"\n", svgW/2, esc(c.title))
	// Axes and grid.
	for i := 0; i <= 5; i++ {
		y := maxY * float64(i) / 5
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", padL, ty(y), svgW-padR, ty(y))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", padL-6, ty(y)+4, num(y))
	}
	ticks := c.xticks
	if len(ticks) == 0 {
		if c.logX {
			for p := math.Floor(math.Log10(minX)); p <= math.Ceil(math.Log10(maxX)); p++ {
				ticks = append(ticks, math.Pow(10, p))
			}
		} else {
			for i := 0; i <= 5; i++ {
				ticks = append(ticks, minX+(maxX-minX)*float64(i)/5)
			}
		}
	}
	for _, x := range ticks {
		if c.logX && (x < minX*0.999 || x > maxX*1.001) {
			continue
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", tx(x), padT, tx(x), svgH-padB)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", tx(x), svgH-padB+16, num(x))
	}
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", padL, svgH-padB, svgW-padR, svgH-padB)
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", padL, padT, padL, svgH-padB)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", padL+(svgW-padL-padR)/2, svgH-12, esc(c.xlabel))
	fmt.Fprintf(&b, `<text x="16" y="%.1f" text-anchor="middle" transform="rotate(-90 16 %.1f)">%s</text>`+"\n", padT+(svgH-padT-padB)/2, padT+(svgH-padT-padB)/2, esc(c.ylabel))
	for i, s := range c.series {
		var pts []string
		for j := range s.xs {
			if c.logX && s.xs[j] <= 0 {
				continue
			}
			if s.step && len(pts) > 0 {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", tx(s.xs[j]), ty(s.ys[j-1])))
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", tx(s.xs[j]), ty(s.ys[j])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", s.color, strings.Join(pts, " "))
		if !s.step {
			for j := range s.xs {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", tx(s.xs[j]), ty(s.ys[j]), s.color)
			}
		}
		ly := padT + 10 + float64(i)*18
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/>`+"\n", svgW-padR+10, ly, svgW-padR+30, ly, s.color)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", svgW-padR+35, ly+4, esc(s.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func num(v float64) string {
	switch {
	case v == math.Trunc(v):
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.0f", v)
	case v >= 1:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2g", v)
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// cdfSVG: per mode, the CDF of checkpoint latency per turn (turns without
// a checkpoint count as 0 ms and make the curve start high).
func (rep *Report) cdfSVG() string {
	c := chart{title: "Checkpoint latency per turn (CDF)", xlabel: "ms (log scale; turns without checkpoint at the left edge)", ylabel: "share of turns", logX: true}
	for _, m := range []string{ModeArbor, ModeFull, ModeFSOnly} {
		var xs []float64
		for _, run := range rep.Runs {
			if run.Mode != m {
				continue
			}
			for _, t := range run.Turns {
				if !t.Setup {
					xs = append(xs, math.Max(t.CkptMS, 0.1))
				}
			}
		}
		if len(xs) == 0 {
			continue
		}
		sort.Float64s(xs)
		s := series{name: modeTitle[m], color: palette[m], step: true}
		for i, x := range xs {
			s.xs = append(s.xs, x)
			s.ys = append(s.ys, float64(i+1)/float64(len(xs)))
		}
		c.series = append(c.series, s)
	}
	return c.render()
}

func (rep *Report) branchSVG() string {
	c := chart{title: "branch(n) latency (p50)", xlabel: "n (children)", ylabel: "ms", logX: true}
	for _, n := range rep.BranchN {
		c.xticks = append(c.xticks, float64(n))
	}
	for _, m := range []string{ModeArbor, ModeArborPrepared, "runc", ModeArborZFS} {
		if _, ok := rep.Branch[m]; !ok {
			continue
		}
		s := series{name: modeTitle[m], color: palette[m]}
		for _, n := range rep.BranchN {
			if xs := rep.Branch[m][n]; len(xs) > 0 {
				s.xs = append(s.xs, float64(n))
				s.ys = append(s.ys, Percentiles(xs).P50)
			}
		}
		c.series = append(c.series, s)
	}
	return c.render()
}

func (rep *Report) treeSVG() string {
	c := chart{title: "Tree rollouts: branch vs replay", xlabel: "branching factor", ylabel: "seconds"}
	a := series{name: "branch", color: palette[ModeArbor]}
	r := series{name: "replay", color: palette[ModeReplay]}
	for _, t := range rep.Tree {
		c.xticks = append(c.xticks, float64(t.Factor))
		a.xs, a.ys = append(a.xs, float64(t.Factor)), append(a.ys, t.BranchS)
		r.xs, r.ys = append(r.xs, float64(t.Factor)), append(r.ys, t.ReplayS)
	}
	c.series = []series{a, r}
	return c.render()
}

// classesSVG: a stacked bar per trace (and all traces) of Arbor's turns
// per class.
func (rep *Report) classesSVG() string {
	type bar struct {
		name string
		c    map[string]int
		n    int
	}
	var bars []bar
	all := bar{name: "all", c: map[string]int{}}
	for _, run := range rep.Runs {
		if run.Mode != ModeArbor {
			continue
		}
		b := bar{name: run.Trace, c: map[string]int{}}
		for _, t := range run.Turns {
			if t.Setup {
				continue
			}
			b.c[t.Class]++
			b.n++
			all.c[t.Class]++
			all.n++
		}
		bars = append(bars, b)
	}
	bars = append(bars, all)
	var s strings.Builder
	fmt.Fprintf(&s, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", svgW, svgH, svgW, svgH)
	s.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	fmt.Fprintf(&s, `<text x="%d" y="22" text-anchor="middle" font-size="15">Arbor: share of turns per checkpoint class</text>`+"\n", svgW/2)
	plotW, plotH := svgW-padL-padR, svgH-padT-padB
	bw := plotW / float64(max(1, len(bars))) * 0.6
	for i := 0; i <= 4; i++ {
		y := svgH - padB - float64(i)/4*plotH
		fmt.Fprintf(&s, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.1f" y="%.1f" text-anchor="end">%d%%</text>`+"\n",
			padL, y, svgW-padR, y, padL-6, y+4, i*25)
	}
	kinds := []string{"none", "fs", "proc", "full"}
	for i, b := range bars {
		x := padL + (float64(i)+0.2)*plotW/float64(len(bars))
		y := svgH - padB
		for _, k := range kinds {
			if b.n == 0 {
				continue
			}
			h := float64(b.c[k]) / float64(b.n) * plotH
			y -= h
			fmt.Fprintf(&s, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", x, y, bw, h, kindColor[k])
			if h > 14 {
				fmt.Fprintf(&s, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="white">%.0f%%</text>`+"\n", x+bw/2, y+h/2+4, 100*float64(b.c[k])/float64(b.n))
			}
		}
		fmt.Fprintf(&s, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x+bw/2, svgH-padB+16, esc(b.name))
	}
	for i, k := range kinds {
		ly := padT + 10 + float64(i)*18
		fmt.Fprintf(&s, `<rect x="%.1f" y="%.1f" width="14" height="12" fill="%s"/><text x="%.1f" y="%.1f">%s</text>`+"\n",
			svgW-padR+12, ly-8, kindColor[k], svgW-padR+32, ly+2, k)
	}
	s.WriteString("</svg>\n")
	return s.String()
}
