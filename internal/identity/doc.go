// Package identity is a router's identity in its cluster: an X.509
// certificate, signed by the cluster's own CA, that names the router.
//
// The name is carried in a URI subject alternative name,
// urn:warmroute:router:<name>, so a certificate the same CA signed for
// anything else never passes for a router. The router's node name (gossip
// member name and Raft server ID) must equal the name its certificate
// proves: peers accept Raft connections, forwarded admin writes and
// gossiped figures from a router only under that name.
//
// A certificate proves a router only when issued for what it is used for
// (its extended key usage: TLS server authentication to serve, client
// authentication to dial, both to sign gossip) and not revoked: every
// check consults the Bundle's Revocations, router names and serial
// numbers the cluster agreed on through Raft.
//
// The package loads a router's certificate, key and CA (Load), builds the
// mutual-TLS configurations for both directions of a connection, signs and
// verifies messages with the router's key (gossip figures), and creates a
// cluster CA and router certificates (the 'warmroute tls' command).
package identity
