// Package limit bounds the connections a listener holds, in two pools.
// A connection starts pending (its peer proved nothing yet): at most Max
// of them, at most PerIP from one address. A new connection always gets
// a pending slot: over PerIP the oldest pending connection of its own
// address is closed for it, over Max the oldest of the address holding
// the most. A flood costs file descriptors for an instant, and an
// unauthenticated neighbour that holds idle connections only ever churns
// its own: it cannot keep a slot from a router or the operator. Once the
// peer proves who it is (a router's certificate, the admin token), the
// listener's user calls Promote, which moves the connection to a proven
// pool bounded apart (per key: a router's name, an operator's address)
// that nothing a neighbour does can fill or empty.
//
// The Raft listener promotes a connection after its TLS handshake proved
// a router and the preamble its cluster; the admin listener after a
// request carried the token, came from loopback or was forwarded by a
// router proving its name; gossip streams (memberlist's TCP, short-lived)
// stay pending. The traffic listener has its own cap (--max-conns) that
// answers 503 first.
package limit
