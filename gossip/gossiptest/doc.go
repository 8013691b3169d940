// Package gossiptest plays a hostile holder of the gossip key against
// warmroute routers, for end-to-end tests in other packages, much as
// net/http/httptest serves HTTP tests. It is test support: no router uses
// it.
//
// Someone who holds the cluster's gossip key (AES-GCM) but no router
// certificate can craft load packets in any node's name (ForgePublish,
// ForgeBye), sign them with a certificate of its own, from another CA or
// for another name (ForgeSigned), announce any chain (ForgeChain), send
// them to a router's gossip port (Send), and join memberlist under a
// name of its choice to receive, and later replay, the signed packets the
// routers send every member (Join). A router with an Identity must refuse
// all of it; one without takes unsigned figures from any key holder.
//
// The encoding here is written independently of package gossip, from
// docs/gossip.md, and is checked against real Clusters by this package's
// tests.
package gossiptest
