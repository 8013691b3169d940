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
// The package loads a router's certificate, key and CA (Load), builds the
// mutual-TLS configurations for both directions of a connection, signs and
// verifies messages with the router's key (gossip figures), and creates a
// cluster CA and router certificates (the 'warmroute tls' command).
package identity
