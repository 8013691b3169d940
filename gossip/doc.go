// Package gossip shares load among warmroute router nodes.
//
// With one router its own in-flight counters are the truth. With N routers
// behind a load balancer each sees about 1/N of every instance's load, so a
// concurrency threshold would silently become N times too loose and overflow
// decisions would differ from node to node. A Mesh fixes that:
//
//   - Membership of router nodes runs on hashicorp/memberlist (SWIM with
//     Lifeguard), tuned to detect a crashed node in about a second on a LAN.
//     Node metadata carries the node's admin and Raft addresses.
//   - Each node reads its own exact in-flight count per backend every
//     ChangeDelay (5 ms) and sends the figures that changed straight to
//     every other member at once, so a request that ended stops counting
//     elsewhere within milliseconds; every PublishInterval (50 ms) it
//     repeats the figures that changed in the last ResendCount intervals
//     (loss repair), and everything every RefreshInterval. One UDP packet
//     per 1.3 KB of figures on the gossip port, no gossip hops, sealed
//     with AES-GCM under the cluster key, at most one publish per
//     ChangeDelay. These packets bypass memberlist, so they never crowd
//     out its membership messages.
//     Every node keeps the latest figure from every other node; the sum of
//     those is View.RemoteInFlight, and global in-flight is the proxy's own
//     counter plus that sum. Figures not refreshed within ExpireAfter are
//     ignored; a node that leaves (it says so directly before leaving) or is
//     declared dead is dropped at once.
//   - memberlist's TCP push/pull (LocalState/MergeRemoteState) carries a
//     node's full view, so a late joiner converges in one exchange.
//   - With an Identity (Config.Identity: a certificate from the cluster CA
//     naming the router) every load packet, goodbye and push/pull state is
//     signed, and a figure from node N counts only when signed with a
//     certificate proving N. Certificate chains travel in their own
//     messages; replays change nothing (send time within maxClockSkew, seq
//     strictly growing within a run); push/pull then carries only the
//     sender's own figures, so a late joiner converges within one
//     RefreshInterval. Without one, any holder of the gossip key speaks for
//     every node.
//   - Everything from another node is bounded: figures out of range are
//     dropped and counted (rejected_total{reason}), never clamped, and
//     members must have valid router names.
//   - Each figure carries the node's own verdict on the backend (failing
//     after its health checks or passive ejection). View.Health lists who
//     sees a backend failing; the Raft leader commits it down or up by
//     majority, so one router's trouble does not take it out for all.
//   - Engine metrics (KV-cache usage, running and waiting requests, prefix
//     cache hit rate) of each backend are scraped by exactly one live node,
//     chosen by rendezvous hashing of the backend id over member names
//     (View.Scraper, Mesh.IsScraper), and shared the same way.
//
// Readers never take a lock: the Mesh builds an immutable View whenever a
// figure or the membership changes, swaps it in atomically and wakes its
// subscribers (Subscribe) without ever blocking.
//
// The wire format (wire.go) is versioned and made of tagged, length-prefixed
// sections, so later releases can add per-backend fields that older
// nodes skip (the health section was added that way); signed messages are
// version 2. Package gossiptest crafts hostile packets for tests.
// docs/gossip.md describes the protocol and its measured cost.
package gossip
