package extproc

import (
	"context"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/eppclient"
	"go.uber.org/goleak"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestShutdownLeavesNothing: streams decided, answered, reset and left
// hanging, then Shutdown: every goroutine of the server and of its
// streams (their readers included) is gone.
func TestShutdownLeavesNothing(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s, addr := testServer(t, 4)
	c, err := eppclient.Dial(addr, true)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`)
	x, err := c.Pick(ctx, &eppclient.Request{Body: body})
	if err != nil || len(x.Answer.Endpoints) != 3 {
		t.Fatalf("endpoints %v (%v)", x.Answer.Endpoints, err)
	}
	if _, err := x.Finish(&eppclient.Response{Served: x.Answer.Endpoints[0], Status: 200, ContentType: "application/json"}); err != nil {
		t.Fatal(err)
	}
	x, err = c.Pick(ctx, &eppclient.Request{Body: body})
	if err != nil {
		t.Fatal(err)
	}
	x.Reset()
	// One left open in the response phase: Shutdown cuts it at its
	// deadline.
	if _, err = c.Pick(ctx, &eppclient.Request{Body: body}); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Health(ctx, ServiceReadiness); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("readiness %v (%v), want SERVING", st, err)
	}
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	s.Shutdown(sctx)
	s.Shutdown(sctx)
	c.Close()
}
