// Package testkit holds the helpers that the tests of several packages
// share: WaitFor and Poll wait for a condition instead of sleeping, Buffer
// is a writer that goroutines may log to while a test reads it, and
// VerifyNoLeaks and IgnoreCurrent check that a test leaves no goroutine
// behind.
//
// It is a leaf: it imports only the standard library and goleak, so that
// any package of the module may use it in its tests. Nothing here is used
// outside of tests.
package testkit
