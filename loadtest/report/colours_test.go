package report

import (
	"testing"

	"github.com/warmroute/warmroute/ring"
)

// TestStrategyColours walks ring's strategy table: every strategy keeps a
// colour of its own in every chart, whatever runs a report holds.
func TestStrategyColours(t *testing.T) {
	owner := map[string]string{}
	for _, info := range ring.Strategies() {
		c, ok := fixedColours[info.Name]
		if !ok {
			t.Errorf("%s has no fixed colour: add it to fixedColours", info.Name)
			continue
		}
		if o, taken := owner[c]; taken {
			t.Errorf("%s and %s share the colour %s", o, info.Name, c)
		}
		owner[c] = info.Name
	}
}
