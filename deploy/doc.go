// Package deploy holds no code. Its directory carries the deployment files
// (deploy/docker, deploy/compose, deploy/k8s, deploy/prometheus,
// deploy/grafana) and its tests check them:
//
//   - the Kubernetes manifests decode strictly into the k8s.io/api types
//     (unknown or misspelled fields, duplicate keys, wrong types and bad
//     quantities fail) and pass the cross-object checks the API server or
//     the deployment itself would fail on (selectors, named ports, volumes,
//     the restricted Pod Security Standard, one router per zone);
//   - the compose file wires three zones consistently (addresses, seeds,
//     backends, networks);
//   - every WARMROUTE_* variable in compose and Kubernetes names a flag of
//     `warmroute serve`, since unknown variables are silently ignored;
//   - every metric the Grafana dashboard and the Prometheus rules query is
//     exported by a running router or gpusim.
//
// The compose stack itself is exercised by scripts/compose-smoke.sh.
package deploy
