package cluster

import (
	"errors"

	"github.com/warmroute/warmroute/internal/identity"
)

// errNoProbe: the Agreement runs on an in-memory network, where there is
// nothing to prove.
var errNoProbe = errors.New("cluster: no identity probes on an in-memory network")

// ProbePeer runs, once, the identity probe that routers run on each other
// before the leader lets one into the Raft configuration: a connection to
// the router id at its Raft address addr that, with an identity, proves
// id's name with a certificate of this router's CA, then exchanges the
// preamble naming both clusters. A router that is kept waiting calls it
// to tell its operator why: a peer it cannot prove (another CA, one side
// without cluster TLS) proves nothing to it either. It takes at most
// RaftHandshakeTimeout.
func (c *Agreement) ProbePeer(id, addr string) error {
	if c.stream == nil {
		return errNoProbe
	}
	var expect func(string) error
	if c.cfg.Identity != nil {
		expect = identity.ExpectName(id)
	}
	return c.stream.probe(addr, expect)
}
