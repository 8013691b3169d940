package trace

import (
	"time"

	"github.com/warmroute/warmroute/loadtest/gpusim"
	"github.com/warmroute/warmroute/loadtest/stats"
	"github.com/warmroute/warmroute/loadtest/workload"
)

// Bounds computes the offline hit-rate bounds of a replay without sending
// it: every request is rendered as the replay would send it and its KV
// blocks computed as gpusim computes them (gpusim.PromptBlocks, blocks of
// c.BlockTokens tokens of bytesPerToken bytes). Requests sent before
// warmup (replay time) fill the caches but are not counted, as a load
// test's warm-up. The replay is consumed.
func Bounds(p *Replay, c stats.BoundsConfig, bytesPerToken int, warmup time.Duration) (stats.BoundsResult, error) {
	b, err := stats.NewBounds(c)
	if err != nil {
		return stats.BoundsResult{}, err
	}
	var req workload.Request
	for {
		at, ok := p.NextAt(&req)
		if !ok {
			return b.Result(), nil
		}
		chain, tokens, err := gpusim.PromptBlocks(req.Path, req.Body, bytesPerToken, c.BlockTokens)
		if err != nil {
			b.Skip()
			continue
		}
		b.Add(chain, tokens, at >= warmup)
	}
}
