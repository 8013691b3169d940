// Package kube finds backends in Kubernetes: the ready pods an
// InferencePool (inference.networking.k8s.io/v1) selects, or the pods of
// a label selector, each podIP:port of the pool's target ports an
// endpoint. It is a cluster.Finder: the Raft leader polls it and commits
// what it finds like every backend change, so every router routes on the
// same backends. It reads the API through client-go and needs get on the
// pool and list on pods in its namespace (deploy/k8s/rbac.yaml).
package kube
