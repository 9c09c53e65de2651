package svg

import (
	"strings"
	"testing"
)

func TestNiceTicksCoverTheDataWithRoundSteps(t *testing.T) {
	for _, c := range []struct {
		hi   float64
		want []float64
		dec  int
	}{
		{104, []float64{0, 50, 100, 150}, 0},
		{1, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}, 1},
		{520, []float64{0, 200, 400, 600}, 0},
		{0, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}, 1},
	} {
		got, dec := NiceTicks(0, c.hi, 5)
		if len(got) != len(c.want) || dec != c.dec {
			t.Errorf("NiceTicks(0, %v) = %v (%d decimals), want %v (%d)", c.hi, got, dec, c.want, c.dec)
			continue
		}
		for i := range got {
			if TickLabel(got[i], dec) != TickLabel(c.want[i], c.dec) {
				t.Errorf("NiceTicks(0, %v) = %v, want %v", c.hi, got, c.want)
				break
			}
		}
	}
}

func TestSVGTextIsEscaped(t *testing.T) {
	d := New(10, 10)
	d.Text(1, 1, TextStyle{Size: 10}, `a<b & "c"`)
	d.Comment("x -- y")
	s := string(d.Bytes())
	if !strings.Contains(s, "a&lt;b &amp; &#34;c&#34;") || strings.Contains(s, "x -- y") {
		t.Fatalf("text or comment not escaped: %s", s)
	}
	if !strings.HasPrefix(s, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+`<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"`) || !strings.HasSuffix(s, "</svg>\n") {
		t.Fatalf("not an SVG document of 10×10: %s", s)
	}
}

func TestStrokesKeepTheirSVGAttributes(t *testing.T) {
	d := New(10, 10)
	d.Line(0, 0, 1, 1, Stroke{Color: "#123456", Width: 1.5, Dash: "2 3", Opacity: 0.5})
	d.Rect(0, 0, 1, 1, "none", "#444444")
	s := string(d.Bytes())
	for _, want := range []string{`stroke="#123456" stroke-width="1.5" fill="none"`, `stroke-dasharray="2 3"`, `stroke-opacity="0.5"`, `stroke="#444444" stroke-width="1"`} {
		if !strings.Contains(s, want) {
			t.Errorf("lacks %q: %s", want, s)
		}
	}
}
