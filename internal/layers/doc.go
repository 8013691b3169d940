// Package layers has no code: its test reads the module's import graph
// (the import lists of every non-test Go file, parsed with go/parser) and
// checks that the arrows point one way.
//
//   - No package under gossip/, ring/ or proxy/ imports anything under
//     node/, directly or through another package: node composes them, not
//     the other way round.
//   - No package under loadtest/ imports anything under node/: the tools
//     talk to routers over HTTP and share parsers through internal/.
//   - A package under internal/ imports no package of the module outside
//     internal/: the leaves stay leaves.
package layers
