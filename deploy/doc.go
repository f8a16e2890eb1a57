// Package deploy holds what runs warmroute outside this repository: the
// container image (Dockerfile), Kubernetes manifests (k8s/) and a Grafana
// dashboard (grafana/warmroute.json). It has no code; its tests check the
// files against the router: every dashboard query names series the router
// exports, every manifest's flags, probes and ports exist on the binary,
// and every container runs as non-root on a read-only root filesystem.
package deploy
