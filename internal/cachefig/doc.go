// Package cachefig holds the figures of a router's cache predictions
// against what the answers delivered, for one decision kind: the proxy
// counts them per backend and exports them (/status, metrics), and the
// load tools read them back and sum them over routers. One type, so the
// two cannot drift apart.
package cachefig
