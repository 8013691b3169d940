package proxy

import (
	"net/http"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them: every
// server, stream, prober and lingering refusal must have stopped. The test
// clients' idle keep-alive connections are closed first. fasthttp's
// per-backend connection cleaner exits within IdleConnTimeout (4 s by
// default) of the last connection closing, so the check waits up to about
// 10 s for it rather than ignoring it.
// ignoreFasthttpClock skips fasthttp's process-wide Date-header clock, one
// goroutine started on first use that runs for the life of the process.
var ignoreFasthttpClock = goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1")

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		http.DefaultClient.CloseIdleConnections()
		// goleak.Find itself retries for about 1.5 s.
		err := goleak.Find(ignoreFasthttpClock)
		for deadline := time.Now().Add(10 * time.Second); err != nil && time.Now().Before(deadline); {
			time.Sleep(500 * time.Millisecond)
			err = goleak.Find(ignoreFasthttpClock)
		}
		if err != nil {
			os.Stderr.WriteString("goleak: goroutines outlived the tests: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}
