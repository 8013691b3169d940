// Package hostname holds the one rule for a host the router is told to
// dial: the host of a backend URL (internal/backendspec, for the proxy and
// the node) and of a gossip seed (gossip's --join entries).
//
// A host is an IP address or a DNS name; anything else could never be
// dialled, and would only fail later, far from the setting that named it.
// The package imports the standard library only.
package hostname
