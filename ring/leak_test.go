package ring

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them (ring
// starts none; this keeps it so).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
