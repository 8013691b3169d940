// Package backendspec is how a backend is written down: its base URL
// (Target: "http://10.0.0.5:8000", "https://gpu-3.example", a bare
// "host:port"), its ID rule, and the spec grammar
// "[id=]url[;zone=z][;weight=n]" that --backends, the config file's
// backends list and the tools that start routers all use.
//
// It is a leaf: the standard library and internal/hostname only, so the
// proxy (which dials Targets), the node (which reads specs from flags and
// YAML) and loadtest (which parses the specs it hands to routers, as the
// router will) share one parser without importing each other.
package backendspec
